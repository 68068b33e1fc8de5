"""Key workers: each workload certificate's key and check in a process of its own. The first
one is forked as the agent starts (agent/sds/workerproc.py), before anything but the standard
library is imported and before any thread or event loop exists. This is the agent's end.

Why: cryptography's import, the key and the check are ~40 ms of CPU on the way to ready, as
much as the agent's start has beyond its floor, and cryptography's code and state ~10 MB of
the agent's memory for its life. Forked, the first key and check run on the other core while
this process imports gRPC and the protos and dials the control plane (the key is asked for as
soon as the config is read, so it is usually made before the channel is up).

The worker answers one key request and one check, then exits; it exits too when this end
closes or after a minute without a request (its parent gone). A signing attempt that fails
closes its worker at once (agent/sds/secrets.py). Each later certificate (a rotation) gets a
worker spawned for it, a new interpreter (this process has threads by then): ~80 ms of CPU
every few hours, and this process never loads cryptography for the workload certificate.
Where no worker can be had or one fails (it died, answered nothing in time, or broke the
wire), the step runs in a thread here (`ThreadKeyWork`): a worker is a head start and a
saving of memory, never a requirement. The key crosses an anonymous socket pair between this
process and its child; nothing is written to disk.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path

from agent.sds.keyspec import KeyAndCsr, KeyType
from agent.sds.keywire import (
    FrameError,
    Frames,
    Message,
    cert_from_reply,
    check_request,
    encode,
    key_from_reply,
    key_request,
)
from agent.sds.keywork import ThreadKeyWork
from agent.sds.workerproc import spawn_key_worker
from agent.sds.workloadcert import WorkloadCert

logger = logging.getLogger(__name__)

# A reply takes a few ms (RSA keys: tens); this much means the worker is stuck.
REPLY_TIMEOUT = 10.0
_REAP_SECONDS = 2.0


class KeyWorker:
    """One worker process: one key, then one check, then it exits. Its steps return None when
    it cannot answer (it died, answered nothing in time, or broke the wire); it is closed
    then. Used from the event loop only."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        """A worker `fork_key_worker()` forked or `spawn_key_worker()` spawned
        (agent/sds/workerproc.py): its pid and this end of its socket pair."""
        self.pid: int | None = pid
        self._sock: socket.socket | None = sock
        self._asked: tuple[str, KeyType] | None = None  # the key request sent
        self._keyed = False  # its key was taken: its one check is next
        self._frames = Frames()
        self.cpu_seconds: float | None = None  # the worker's, once it is reaped
        # Non-blocking for the event loop's sock_* calls; `ask_first`'s one small write
        # into the empty socket buffer never waits either.
        sock.setblocking(False)

    @classmethod
    async def spawn(cls) -> KeyWorker | None:
        """A fresh worker (a new interpreter: this process has threads by now), or None."""
        spawned = await asyncio.to_thread(spawn_key_worker)
        if spawned is None:
            logger.debug("no key worker could be spawned; working in this process")
            return None
        return cls(*spawned)

    @property
    def can_check(self) -> bool:
        """Whether `check` is this worker's one check (no key it was asked for is pending)."""
        return self._sock is not None and (self._asked is None or self._keyed)

    def ask_first(self, identity: str, key_type: KeyType) -> None:
        """Ask now for the key of `identity`, which `new_key` then returns (blocking but
        short: a small write into an empty socket; before the event loop runs)."""
        if self._sock is None or self._asked is not None:
            return
        self._sock.sendall(encode(key_request(identity, key_type)))
        self._asked = (identity, key_type)

    def abandon(self) -> None:
        """Closed without waiting for the worker (it exits on reading EOF): for an agent that
        stops before its event loop runs."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def can_make_key(self, identity: str, key_type: KeyType) -> bool:
        """Whether `new_key(identity, key_type)` is this worker's one key."""
        return (
            self._sock is not None
            and not self._keyed
            and self._asked in (None, (identity, key_type))
        )

    async def new_key(self, identity: str, key_type: KeyType) -> KeyAndCsr | None:
        if not self.can_make_key(identity, key_type):
            return None
        self._keyed = True
        if self._asked is None:
            self._asked = (identity, key_type)
            reply = await self._ask(key_request(identity, key_type))
        else:
            reply = await self._reply()
        if reply is None:
            return None
        try:
            return key_from_reply(reply)
        except FrameError as e:
            await self._broken(str(e))
            return None

    async def check(
        self, chain: list[str], key_pem: bytes, root_file: Path | None
    ) -> WorkloadCert | None:
        if not self.can_check:
            # A key it was asked for is still to come: its next answer would be that key.
            await self.close()
            return None
        reply = await self._ask(check_request(chain, key_pem, root_file))
        await self.close()  # its one check answered (or it failed): done
        if reply is None:
            return None
        try:
            return cert_from_reply(reply)
        except FrameError as e:
            logger.debug("key worker: %s", e)
            return None

    async def _ask(self, request: Message) -> Message | None:
        assert self._sock is not None
        try:
            await asyncio.get_running_loop().sock_sendall(self._sock, encode(request))
        except OSError as e:
            await self._broken(str(e))
            return None
        except BaseException:
            self._drop()
            raise
        return await self._reply()

    async def _reply(self) -> Message | None:
        """The worker's next answer; None (and the worker closed) when it has none."""
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(REPLY_TIMEOUT):
                while True:
                    data = await loop.sock_recv(self._sock, 65536)
                    if not data:
                        raise EOFError("the worker exited")
                    messages = self._frames.feed(data)
                    if messages:
                        return messages[0]
        except (OSError, EOFError, FrameError, TimeoutError) as e:
            await self._broken(str(e) or type(e).__name__)
        except BaseException:
            # Cancelled (the signing attempt timed out, the agent stops): its answer would
            # come unread, ahead of the next, so the worker goes.
            self._drop()
            raise
        return None

    def _drop(self) -> None:
        """Closed at once, reaped in a thread of its own (for a cancelled step, which cannot
        wait for it)."""
        sock, self._sock = self._sock, None
        pid, self.pid = self.pid, None
        if sock is not None:
            sock.close()
        if pid is not None:
            threading.Thread(target=_reap, args=(pid,), name="key-worker-reap", daemon=True).start()

    async def _broken(self, why: str) -> None:
        logger.debug("key worker: %s; working in this process", why)
        await self.close()

    async def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        sock.close()  # the worker reads EOF and exits
        pid, self.pid = self.pid, None
        if pid is not None:
            self.cpu_seconds = await asyncio.to_thread(_reap, pid)
            if self.cpu_seconds is not None:
                logger.info("key worker (pid %d) done: %.1f ms CPU", pid, self.cpu_seconds * 1000)


class ProcessKeyWork:
    """`KeyWork` with each certificate's key and check in a worker process of its own: the
    first certificate's in the worker forked at start (given here), each later one's in a
    worker spawned for it (~80 ms of CPU once per rotation, and no cryptography in this
    process for its life). In a thread here when no worker can be had or one fails."""

    def __init__(self, first: KeyWorker | None = None) -> None:
        self._worker = first
        self._lock = asyncio.Lock()
        self._fallback = ThreadKeyWork()

    async def new_key(self, identity: str, key_type: KeyType) -> KeyAndCsr:
        async with self._lock:
            worker = self._worker
            if worker is None or not worker.can_make_key(identity, key_type):
                if worker is not None:
                    await worker.close()  # its key was taken (the attempt failed): spent
                worker = self._worker = await KeyWorker.spawn()
            if worker is not None:
                kc = await worker.new_key(identity, key_type)
                if kc is not None:
                    return kc
                self._worker = None
        return await self._fallback.new_key(identity, key_type)

    async def check(self, chain: list[str], key_pem: bytes, root_file: Path | None) -> WorkloadCert:
        async with self._lock:
            worker, self._worker = self._worker, None
            if worker is None or not worker.can_check:
                if worker is not None:
                    await worker.close()
                worker = await KeyWorker.spawn()
            if worker is not None:
                cert = await worker.check(chain, key_pem, root_file)
                if cert is not None:
                    return cert
        return await self._fallback.check(chain, key_pem, root_file)

    async def close(self) -> None:
        """The current worker, if any, closed and reaped (an attempt that failed leaves it
        waiting for a check); the next key gets a new one."""
        async with self._lock:
            worker, self._worker = self._worker, None
            if worker is not None:
                await worker.close()


def _reap(pid: int) -> float | None:
    """Wait for the worker (killed if it is still there after `_REAP_SECONDS`); its CPU
    seconds, or None if it was not ours to wait for (blocking)."""
    deadline = time.monotonic() + _REAP_SECONDS
    try:
        while True:
            done, _, usage = os.wait4(pid, os.WNOHANG)
            if done:
                return usage.ru_utime + usage.ru_stime
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                _, _, usage = os.wait4(pid, 0)
                return usage.ru_utime + usage.ru_stime
            time.sleep(0.005)
    except ChildProcessError:
        return None
