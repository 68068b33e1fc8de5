"""The key worker: the first workload certificate's key and check, in a process forked when the
agent starts (agent/__main__.py), before gRPC is imported and before any thread or event loop
exists.

Why: cryptography's import, the key and the check are ~40 ms of CPU on the way to ready, as
much as the agent's start has beyond its floor. Forked, they run on the other core while this
process imports gRPC and the protos and dials the control plane; the first key is asked for
as soon as the config is read, so it is usually made before the channel is up. This process
then holds no cryptography until a later key needs it.

The worker answers one key request and one check, then exits; it exits too when this end
closes or after `IDLE_SECONDS` without a request (its parent gone, or the first signing
failed: this end then reaps it at its next key request or when the agent stops). Every
later step, and every step after the worker failed (it died, answered nothing in time, or
broke the wire), runs in a thread here (`ThreadKeyWork`): the worker is a head start, never
a requirement. The key crosses an anonymous socket pair between this process and its child;
nothing is written to disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from agent.sds.keyspec import KeyAndCsr, KeyType
from agent.sds.keywork import (
    FrameError,
    Frames,
    Message,
    ThreadKeyWork,
    answer,
    cert_from_reply,
    check_request,
    encode,
    key_from_reply,
    key_request,
)
from agent.sds.workloadcert import WorkloadCert

logger = logging.getLogger(__name__)

IDLE_SECONDS = 60.0
# A reply takes a few ms (RSA keys: tens); this much means the worker is stuck.
REPLY_TIMEOUT = 10.0
_REAP_SECONDS = 2.0


class KeyWorker:
    """`KeyWork` through the forked worker for the first key and check, through a
    `ThreadKeyWork` after that (or once the worker failed). Used from the event loop only."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        """Made by `fork()`."""
        self.pid: int | None = pid
        self._sock: socket.socket | None = sock
        self._first: tuple[str, KeyType] | None = None  # the key request sent ahead
        self._frames = Frames()
        self._lock = asyncio.Lock()
        self._fallback = ThreadKeyWork()
        self.cpu_seconds: float | None = None  # the worker's, once it is reaped

    @classmethod
    def fork(cls) -> KeyWorker | None:
        """The worker, loading cryptography from now on; None where forking is unsafe
        (another thread runs, or gRPC is imported: its state is not the child's to share)
        or fails. Call before the event loop and gRPC exist, as early as can be: the parent
        copies each page it writes after the fork and was there before it."""
        if threading.active_count() > 1 or "grpc" in sys.modules:
            return None
        parent, child = socket.socketpair()
        try:
            pid = os.fork()
        except OSError as e:
            logger.debug("no key worker: %s", e)
            parent.close()
            child.close()
            return None
        if pid == 0:  # pragma: no cover - the child; tests see it through its answers
            parent.close()
            code = 1
            try:
                _serve(child)
                code = 0
            finally:
                # No atexit handlers, no flushing of the parent's buffers: not our process's.
                os._exit(code)
        child.close()
        return cls(pid, parent)

    def ask_first(self, identity: str, key_type: KeyType) -> None:
        """Ask now for the first key of `identity`, which `new_key` then returns (blocking
        but short: a small write into an empty socket; before the event loop runs)."""
        if self._sock is None or self._first is not None:
            return
        self._sock.sendall(encode(key_request(identity, key_type)))
        self._sock.setblocking(False)
        self._first = (identity, key_type)

    def abandon(self) -> None:
        """Closed without waiting for the worker (it exits on reading EOF): for an agent that
        stops before its event loop runs."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def new_key(self, identity: str, key_type: KeyType) -> KeyAndCsr:
        async with self._lock:
            first, self._first = self._first, None
            if self._sock is not None and first == (identity, key_type):
                reply = await self._reply()
                if reply is not None:
                    with contextlib.suppress(FrameError):  # logged by _broken
                        return key_from_reply(reply)
                    await self._broken("a key answer of the wrong shape")
            else:
                # A second key (the first signing failed) or another identity: the worker's
                # head start is spent.
                await self._close()
        return await self._fallback.new_key(identity, key_type)

    async def check(self, chain: list[str], key_pem: bytes, root_file: Path | None) -> WorkloadCert:
        async with self._lock:
            if self._sock is not None and self._first is None:
                reply = await self._ask(check_request(chain, key_pem, root_file))
                await self._close()  # its one check answered (or it failed): done
                if reply is not None:
                    with contextlib.suppress(FrameError):
                        return cert_from_reply(reply)
                    logger.debug("key worker: a check answer of the wrong shape")
            else:
                # Its first key was never taken: its next answer would be that key.
                await self._close()
        return await self._fallback.check(chain, key_pem, root_file)

    async def close(self) -> None:
        async with self._lock:
            await self._close()

    async def _ask(self, request: Message) -> Message | None:
        assert self._sock is not None
        try:
            await asyncio.get_running_loop().sock_sendall(self._sock, encode(request))
        except OSError as e:
            await self._broken(str(e))
            return None
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
        return None

    async def _broken(self, why: str) -> None:
        logger.debug("key worker: %s; working in this process", why)
        await self._close()

    async def _close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        sock.close()  # the worker reads EOF and exits
        pid, self.pid = self.pid, None
        if pid is not None:
            self.cpu_seconds = await asyncio.to_thread(_reap, pid)
            if self.cpu_seconds is not None:
                logger.info("key worker (pid %d) done: %.1f ms CPU", pid, self.cpu_seconds * 1000)


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


def _serve(sock: socket.socket) -> None:  # pragma: no cover - runs in the forked child
    """The worker's life: load cryptography at once (the point of the worker), then answer
    requests until its check is answered, this end closes, or it idles too long."""
    from agent.sds import certcheck, keys  # noqa: F401

    sock.settimeout(IDLE_SECONDS)
    frames = Frames()
    while True:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            return
        if not data:
            return
        for request in frames.feed(data):
            sock.sendall(encode(answer(request)))
            if request.get("op") == "check":
                return
