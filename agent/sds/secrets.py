"""The secret manager: the workload certificate, the root, file-mounted secrets, gateway
certificates from the control plane (`kubernetes://…`, remote.py), and who to tell when one
of them changes.

It owns two loops. The rotation loop generates a key and CSR (off the event loop), asks the
`CertificateSigner` for a certificate, installs it as `default` (chain + key) and the root as
`ROOTCA`, then sleeps until `RotationSchedule` says to renew; failures are retried with
backoff. The file loop polls the files behind `file-cert:`/`file-root:` secrets that some
stream holds. Every change calls the registered watchers (the SDS streams) with the secret's
name; a watcher reads the new value from `entries()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import grpc

from agent.sds.firstsign import sign_new_key
from agent.sds.keyspec import KeyType, spiffe_id
from agent.sds.keywork import KeyWork, ThreadKeyWork
from agent.sds.names import (
    REMOTE_PREFIX,
    FileSecretError,
    file_resource_paths,
    is_file_resource,
    is_remote_name,
)
from agent.sds.remote import RemoteSecrets
from agent.sds.resources import (
    ROOT_CERT,
    WORKLOAD_CERT,
    SecretEntry,
    tls_certificate,
    validation_context,
)
from agent.sds.rotation import RotationPolicy, RotationSchedule
from agent.sds.signer import CertificateSigner, is_retryable
from agent.sds.workloadcert import SdsStats, WorkloadCert
from pilotfish_common.lifecycle import Lifecycle
from pilotfish_common.tasks import cancel

if TYPE_CHECKING:
    from agent.sds.files import FileSource

logger = logging.getLogger(__name__)

Watcher = Callable[[str], None]


@dataclass(frozen=True, slots=True, eq=False)
class SdsConfig:
    """Whose certificate the secret manager asks for, and how it keeps it fresh."""

    trust_domain: str = "cluster.local"
    namespace: str = "default"
    service_account: str = "default"
    key_type: KeyType = KeyType.EC_P256
    cert_ttl: float = 24 * 3600.0
    # The root served as ROOTCA; None: the last certificate of the signed chain.
    root_cert_file: Path | None = None
    # One signing attempt may take this long before it counts as failed.
    sign_timeout: float = 30.0
    file_poll_interval: float = 2.0
    rotation: RotationPolicy = field(default_factory=RotationPolicy)

    @property
    def identity(self) -> str:
        return spiffe_id(self.trust_domain, self.namespace, self.service_account)


@dataclass(slots=True, eq=False)
class _WatchedFile:
    """A file-mounted secret some stream holds, and what was last read from it."""

    source: FileSource
    refs: int = 0
    contents: tuple[bytes, ...] | None = None  # what the served entry was built from
    error: str = ""  # the last failure, logged once until it changes


class SecretManager(Lifecycle):
    """Holds the served secrets and keeps them fresh. One task drives each loop; watchers
    and `entries()` are used from the event loop only."""

    def __init__(
        self,
        signer: CertificateSigner,
        config: SdsConfig | None = None,
        *,
        stats: SdsStats | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
        remote: RemoteSecrets | None = None,
        first: Awaitable[WorkloadCert] | None = None,
        keys: KeyWork | None = None,
    ) -> None:
        """`remote`: where `kubernetes://` secrets (gateway certificates) come from; None:
        they are unknown names. `first`: a signing attempt already under way for this
        identity and key type (agent/sds/firstsign.py: key, CSR, signing call and the check
        of the answer), taken as the first attempt. `keys`:
        where keys are made and the CA's answers checked (agent/sds/keywork.py; default: in
        a thread here)."""
        self.config = config or SdsConfig()
        self.identity = self.config.identity  # validates the identity parts up front
        self.stats = stats or SdsStats()
        self._signer = signer
        self._rng = rng or random.Random()
        self._clock = clock
        self._entries: dict[str, SecretEntry] = {}
        self._watchers: list[Watcher] = []
        self._files: dict[str, _WatchedFile] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self._issued = asyncio.Event()
        self.current: WorkloadCert | None = None
        self.last_error = ""
        self._remote = remote
        self._first = first
        self._keys: KeyWork = keys or ThreadKeyWork()
        if remote is not None:
            remote.bind(self._remote_update)

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Idempotent: the agent may start it early (agent/launch.py) and again with the rest."""
        if self._tasks:
            return
        self._tasks = [
            asyncio.create_task(self._rotation_loop(), name="sds-rotation"),
            asyncio.create_task(self._file_loop(), name="sds-file-watch"),
        ]

    async def close(self) -> None:
        await cancel(*self._tasks)
        self._tasks = []
        await self._keys.close()
        if self._remote is not None:
            await self._remote.close()

    # --- state -----------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """A workload certificate is held and has not expired."""
        return self.current is not None and self._clock() < self.current.not_after

    async def wait_ready(self, timeout: float | None = None) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._issued.wait()
        return self.ready

    @property
    def serial(self) -> str | None:
        return self.current.serial_hex if self.current is not None else None

    @property
    def expiry(self) -> float | None:
        return self.current.not_after if self.current is not None else None

    def entries(self) -> Mapping[str, SecretEntry]:
        """Every secret that can be served now, by name."""
        return MappingProxyType(self._entries)

    def get(self, name: str) -> SecretEntry | None:
        return self._entries.get(name)

    @staticmethod
    def check_name(name: str, *, remote: bool = False) -> None:
        """FileSecretError unless `name` is a secret the agent serves by itself (or, with
        `remote`, a `kubernetes://` one it fetches from the control plane)."""
        if name in (WORKLOAD_CERT, ROOT_CERT) or (remote and is_remote_name(name)):
            return
        if is_file_resource(name):
            file_resource_paths(name)
            return
        also = f", {REMOTE_PREFIX}<name>" if remote else ""
        raise FileSecretError(
            f"unknown secret {name!r} (served: {WORKLOAD_CERT}, {ROOT_CERT}, "
            f"file-cert:<cert>~<key>, file-root:<ca>{also})"
        )

    def check(self, name: str) -> None:
        """FileSecretError unless `name` is a secret this manager can serve."""
        self.check_name(name, remote=self._remote is not None)

    def refusal(self, name: str) -> tuple[grpc.StatusCode, str] | None:
        """(status, message) when the control plane refused the `kubernetes://` secret
        `name` (this proxy may not read it): it is never served, and SDS says so."""
        if self._remote is None or not is_remote_name(name):
            return None
        return self._remote.refusal(name)

    def watch(self, watcher: Watcher) -> Callable[[], None]:
        """Call `watcher(name)` whenever secret `name` changes; returns the unsubscribe."""
        self._watchers.append(watcher)

        def unwatch() -> None:
            with contextlib.suppress(ValueError):
                self._watchers.remove(watcher)

        return unwatch

    def rotate_now(self) -> None:
        """Renew the workload certificate now instead of at its scheduled time."""
        self._wake.set()

    # --- file-mounted secrets --------------------------------------------------------------

    async def acquire(self, name: str) -> None:
        """A stream needs `name`: start serving (and watching) it if it is file-mounted.
        Invalid names raise FileSecretError; unreadable files are logged and retried."""
        if self._remote is not None and is_remote_name(name):
            self._remote.acquire(name)
            return
        if not is_file_resource(name):
            return
        # Reading and checking them (agent/sds/names.py): imported with the first one, in a
        # thread (a later call finds it imported; sys.modules alone would not say whether
        # another thread is still importing it).
        await asyncio.to_thread(importlib.import_module, "agent.sds.files")
        from agent.sds.files import parse_file_resource

        source = parse_file_resource(name)
        watched = self._files.get(name)
        if watched is not None:
            watched.refs += 1
            return
        watched = self._files[name] = _WatchedFile(source, refs=1)
        await self._load_files([(name, watched)])

    def release(self, name: str) -> None:
        if self._remote is not None and is_remote_name(name):
            self._remote.release(name)
            return
        watched = self._files.get(name)
        if watched is None:
            return
        watched.refs -= 1
        if watched.refs <= 0:
            del self._files[name]
            self._entries.pop(name, None)

    async def _file_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.file_poll_interval)
            if self._files:
                await self._load_files(list(self._files.items()))

    async def _load_files(self, items: list[tuple[str, _WatchedFile]]) -> None:
        snapshot = [(name, w.source, w.contents) for name, w in items]
        results = await asyncio.to_thread(_scan_files, snapshot)
        for name, contents, outcome in results:
            watched = self._files.get(name)
            if watched is None:
                continue  # released while we were reading
            if outcome is None:
                watched.error = ""  # back to the bytes we serve
                continue
            if isinstance(outcome, FileSecretError):
                if str(outcome) != watched.error:
                    watched.error = str(outcome)
                    self.stats.on_file_failure()
                    logger.warning("secret %s: %s (keeping the last good version)", name, outcome)
                continue
            watched.error = ""
            watched.contents = contents
            self._set(name, outcome)

    # --- the workload certificate ----------------------------------------------------------

    async def _rotation_loop(self) -> None:
        schedule = RotationSchedule(self.config.rotation, self._rng)
        while True:
            try:
                cert = await self._issue()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                retryable = is_retryable(e)
                self.stats.on_failure(retryable)
                self.last_error = str(e) or type(e).__name__
                delay = schedule.after_failure(self._clock(), self.expiry, retryable=retryable)
                logger.log(
                    logging.WARNING if retryable else logging.ERROR,
                    "workload certificate signing failed (attempt %d, next in %.1fs): %s",
                    schedule.failures,
                    delay,
                    self.last_error,
                )
            else:
                self._install(cert)
                delay = schedule.after_success(cert.not_before, cert.not_after, self._clock())
                logger.debug("next certificate renewal in %.1fs", delay)
            # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancellation that
            # arrives with the wake-up, and close() would then wait for the next rotation.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            self._wake.clear()

    async def _issue(self) -> WorkloadCert:
        self.stats.on_attempt()
        # The attempt started before this manager existed (agent/launch.py), if any: first.
        attempt, self._first = self._first, None
        try:
            async with asyncio.timeout(self.config.sign_timeout):
                if attempt is None:
                    cfg = self.config
                    attempt = sign_new_key(
                        self._signer,
                        self._keys,
                        self.identity,
                        cfg.key_type,
                        cfg.cert_ttl,
                        cfg.root_cert_file,
                    )
                return await attempt
        except BaseException:
            # A key worker process waiting for this attempt's check goes now (the next attempt
            # makes a new key), not when that attempt comes, a minute later perhaps.
            await self._keys.close()
            raise

    def _install(self, cert: WorkloadCert) -> None:
        first = self.current is None
        self.current = cert
        self.last_error = ""
        self.stats.on_issued(cert.not_after)
        if cert.identity is not None and cert.identity != self.identity:
            # The CA names us from our credentials; a mismatch means the token belongs to
            # another service account than the agent was told.
            logger.warning("certificate identity %s differs from %s", cert.identity, self.identity)
        logger.info(
            "workload certificate %s: serial %s, valid until %s",
            "issued" if first else "rotated",
            cert.serial_hex,
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(cert.not_after)),
        )
        self._set(WORKLOAD_CERT, tls_certificate(WORKLOAD_CERT, cert.chain_pem, cert.key_pem))
        self._set(ROOT_CERT, validation_context(ROOT_CERT, cert.root_pem))
        self._issued.set()

    def _remote_update(self, name: str, entry: SecretEntry | None) -> None:
        if entry is not None:
            self._set(name, entry)
            return
        self._entries.pop(name, None)
        self._notify(name)  # the streams holding it look at its refusal

    def _set(self, name: str, entry: SecretEntry) -> None:
        old = self._entries.get(name)
        if old is not None and old.version == entry.version:
            return
        self._entries[name] = entry
        self._notify(name)

    def _notify(self, name: str) -> None:
        for w in list(self._watchers):
            try:
                w(name)
            except Exception:
                logger.exception("secret watcher failed for %s", name)


def _scan_files(
    items: list[tuple[str, FileSource, tuple[bytes, ...] | None]],
) -> list[tuple[str, tuple[bytes, ...], SecretEntry | FileSecretError | None]]:
    """Read each source; build entries for the ones whose bytes changed (None: unchanged)
    (blocking)."""
    from agent.sds.files import build_entry, read_contents  # imported by `acquire` already

    out: list[tuple[str, tuple[bytes, ...], SecretEntry | FileSecretError | None]] = []
    for name, source, previous in items:
        try:
            contents = read_contents(source)
            if contents == previous:
                out.append((name, contents, None))
                continue
            out.append((name, contents, build_entry(name, source, contents)))
        except FileSecretError as e:
            out.append((name, (), e))
    return out
