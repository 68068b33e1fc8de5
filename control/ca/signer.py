"""Signing off the event loop, in a worker process: `ProcessSigner` starts
`python -m control.ca.signworker`, hands it the CA material through its stdin, and sends it
the CSRs of concurrent calls in batches (control/ca/signwire.py has the frames and the
batching rules).

A worker that dies (killed, crashed, or answering garbage) costs only the calls it was
signing at that moment: they fail with `SignerUnavailable` (the gRPC service answers
UNAVAILABLE, and callers retry); calls still waiting go to a new worker, started at once
after a healthy run and with a growing pause when workers keep dying young.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import logging
import sys
import time
from collections.abc import Callable

from cryptography.hazmat.primitives import serialization

from control.ca.authority import CertificateAuthority, CsrError
from control.ca.identity import Identity
from control.ca.signwire import (
    HEADER_SIZE,
    CaMaterial,
    Outcome,
    SignJob,
    SignQueue,
    WireError,
    frame_length,
    init_frame,
    parse,
    parse_outcomes,
    sign_frame,
)
from pilotfish_common.lifecycle import Lifecycle
from pilotfish_common.tasks import cancel

logger = logging.getLogger(__name__)

WORKER_MODULE = "control.ca.signworker"
# A worker that lived this long was healthy: the next one starts without a pause.
_HEALTHY_RUN = 1.0
_MAX_PAUSE = 5.0


class SignerUnavailable(Exception):
    """No worker could sign this call (it died while signing, or the CA is closing); the
    call may be retried."""


class SignerFailed(Exception):
    """The worker could not sign a CSR it accepted (a fault inside the CA)."""


def material_of(authority: CertificateAuthority) -> CaMaterial:
    return CaMaterial(
        cert_pems=tuple(authority.chain_pems),
        key_pem=authority.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        trust_domain=authority.trust_domain,
        max_workload_ttl=authority.limits.max_workload_ttl,
    )


def restart_pause(early_deaths: int) -> float:
    """Seconds to wait before the next worker, after `early_deaths` workers in a row died
    within `_HEALTHY_RUN` of their start."""
    if early_deaths <= 0:
        return 0.0
    return float(min(_MAX_PAUSE, 0.05 * 2 ** (early_deaths - 1)))


class ProcessSigner(Lifecycle):
    """`sign()` from the event loop; the signature is made in the worker process."""

    def __init__(
        self,
        authority: CertificateAuthority,
        *,
        max_in_flight: int = 2,
        max_batch: int = 64,
        on_restart: Callable[[], None] | None = None,
        python: str = sys.executable,
        close_timeout: float = 5.0,
    ) -> None:
        self._material = material_of(authority)
        self._chain = list(authority.chain_pems)
        self._queue = SignQueue(max_in_flight, max_batch)
        self._futures: dict[int, asyncio.Future[str]] = {}
        self._ids = itertools.count(1)
        self._on_restart = on_restart
        self._python = python
        self._close_timeout = close_timeout
        self._proc: asyncio.subprocess.Process | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._closing = False
        self._started_at = 0.0
        self._early_deaths = 0
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        """The current worker's process id (None while there is none)."""
        return None if self._proc is None else self._proc.pid

    async def start(self) -> None:
        """Start the worker; returns once it runs (not once it has loaded the CA: the first
        batch simply waits in the pipe behind the CA material)."""
        if self._supervisor is not None:
            raise RuntimeError("the signer was already started")
        await self._spawn()
        self._supervisor = asyncio.create_task(self._supervise(), name="ca-signer")

    async def close(self) -> None:
        """Let the worker finish what it has, then stop it; calls still waiting fail with
        SignerUnavailable. Idempotent."""
        if self._closing:
            return
        self._closing = True
        proc = self._proc
        if proc is not None and proc.stdin is not None:
            proc.stdin.close()  # end of input: the worker answers what it has and exits
        if self._supervisor is not None:
            try:
                async with asyncio.timeout(self._close_timeout):
                    await asyncio.shield(self._supervisor)
            except TimeoutError:
                logger.warning("CA signing worker did not stop in %.0fs", self._close_timeout)
                await cancel(self._supervisor)
        if self._proc is not None:
            await _kill(self._proc)
            self._proc = None
        self._fail(self._queue.drain(), "the CA is shutting down")

    async def sign(
        self, csr_pem: bytes, identity: Identity, ttl_seconds: float, now: dt.datetime
    ) -> list[str]:
        """`CertificateAuthority.sign_csr`, in the worker: the PEM chain, leaf first. Raises
        CsrError (the CSR is refused), SignerFailed, or SignerUnavailable."""
        if self._closing:
            raise SignerUnavailable("the CA is shutting down")
        job = SignJob(
            next(self._ids),
            csr_pem,
            identity.namespace,
            identity.service_account,
            ttl_seconds,
            now.timestamp(),
        )
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._futures[job.id] = future
        self._queue.add(job)
        self._pump()
        try:
            leaf = await future
        finally:
            self._futures.pop(job.id, None)
            self._queue.discard(job.id)
        return [leaf, *self._chain]

    # --- the worker ------------------------------------------------------------------------

    async def _spawn(self) -> None:
        proc = await asyncio.create_subprocess_exec(
            self._python,
            "-m",
            WORKER_MODULE,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert proc.stdin is not None
        proc.stdin.write(init_frame(self._material))
        self._proc = proc
        self._started_at = time.monotonic()
        logger.debug("CA signing worker started: pid %d", proc.pid)
        self._pump()

    def _pump(self) -> None:
        """Write every batch the pipe has room for."""
        proc = self._proc
        if proc is None or proc.stdin is None or self._closing:
            return
        while (batch := self._queue.next_batch()) is not None:
            proc.stdin.write(sign_frame(batch))

    async def _supervise(self) -> None:
        """Read the current worker's answers; when it goes, fail what it had and start the
        next one (until closing)."""
        while True:
            proc = self._proc
            if proc is not None:
                why = await self._read(proc)
                await self._worker_gone(proc, why)
            if self._closing:
                return
            pause = restart_pause(self._early_deaths)
            if pause:
                await asyncio.sleep(pause)
            if self._closing:
                return
            try:
                await self._spawn()
            except OSError as e:
                logger.error("cannot start the CA signing worker: %s", e)
                self._early_deaths += 1
                waiting = self._queue.drain()
                self._fail(waiting, f"the CA signing worker cannot start: {e}")
                continue
            self.restarts += 1
            if self._on_restart is not None:
                self._on_restart()

    async def _read(self, proc: asyncio.subprocess.Process) -> str:
        """Deliver results until the worker's output ends; why it ended."""
        assert proc.stdout is not None
        try:
            while True:
                header = await proc.stdout.readexactly(HEADER_SIZE)
                payload = await proc.stdout.readexactly(frame_length(header))
                outcomes = parse_outcomes(parse(payload))
                self._queue.answered(outcomes)
                for o in outcomes:
                    self._deliver(o.id, o.outcome, o.text)
                self._pump()
        except asyncio.IncompleteReadError:
            return "its output ended"
        except WireError as e:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()  # what it says can no longer be matched to the calls
            return f"it sent a corrupt answer ({e})"

    def _deliver(self, job_id: int, outcome: Outcome, text: str) -> None:
        future = self._futures.get(job_id)
        if future is None or future.done():
            return  # the caller went away meanwhile
        if outcome is Outcome.SIGNED:
            future.set_result(text)
        elif outcome is Outcome.BAD_CSR:
            future.set_exception(CsrError(text))
        else:
            future.set_exception(SignerFailed(text))

    async def _worker_gone(self, proc: asyncio.subprocess.Process, why: str) -> None:
        await _kill(proc)
        self._proc = None
        lost = self._queue.lost()
        lived = time.monotonic() - self._started_at
        self._early_deaths = self._early_deaths + 1 if lived < _HEALTHY_RUN else 0
        self._fail(lost, "the CA signing worker exited while signing this request; retry")
        if self._closing and proc.returncode == 0:
            return
        logger.warning(
            "CA signing worker pid %d exited (code %s: %s) after %.1fs; %d call(s) it was "
            "signing fail%s",
            proc.pid,
            proc.returncode,
            why,
            lived,
            len(lost),
            "" if self._closing else ", starting a new one",
        )

    def _fail(self, job_ids: list[int], message: str) -> None:
        for job_id in job_ids:
            future = self._futures.get(job_id)
            if future is not None and not future.done():
                future.set_exception(SignerUnavailable(message))


async def _kill(proc: asyncio.subprocess.Process) -> None:
    """Wait for a worker that has ended its output; kill one that did so and lingers (a
    corrupt stream), so no worker outlives its pipe."""
    try:
        async with asyncio.timeout(2.0):
            await proc.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
