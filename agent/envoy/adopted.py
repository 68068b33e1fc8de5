"""An Envoy forked before the event loop existed (agent/envoy/earlystart.py), adopted by the
supervisor (agent/envoy/process.py) once the loop runs.

Apart from earlystart.py, which runs before the agent imports asyncio and must stay light.
"""

from __future__ import annotations

import asyncio
import os
import signal

from agent.envoy.earlystart import ForkedProcess


class AdoptedProcess:
    """An Envoy forked before the event loop existed (agent/envoy/earlystart.py), seen as the
    supervisor sees an `asyncio.subprocess.Process`: its stderr as a stream, its exit through
    a pidfd the loop watches (no thread, and no child watcher that could reap another
    child), its signals sent through that pidfd (never to a reused pid)."""

    def __init__(self, forked: ForkedProcess, limit: int) -> None:
        self.pid = forked.pid
        self.returncode: int | None = None
        self.stderr = asyncio.StreamReader(limit=limit)
        self._stderr_fd = forked.stderr
        self._pidfd = -1
        self._exited: asyncio.Future[int] | None = None
        self._waiter: asyncio.Task[None] | None = None

    async def watch(self) -> None:
        """Start reading stderr and watching for the exit (once, in the event loop)."""
        loop = asyncio.get_running_loop()
        self._exited = loop.create_future()
        pipe = os.fdopen(self._stderr_fd, "rb", buffering=0)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(self.stderr, loop=loop), pipe
        )
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except OSError:  # no pidfd (Linux < 5.3): a thread waits for the exit instead
            self._waiter = loop.create_task(self._wait_in_thread(), name="envoy-wait")
            return
        loop.add_reader(self._pidfd, self._reap)
        self._reap()  # it may have exited already

    def _reap(self) -> None:
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere: its status is lost
            pid, status = self.pid, 255 << 8
        if pid == 0:
            return
        asyncio.get_running_loop().remove_reader(self._pidfd)
        self._exited_with(os.waitstatus_to_exitcode(status))

    async def _wait_in_thread(self) -> None:
        _, status = await asyncio.to_thread(os.waitpid, self.pid, 0)
        self._exited_with(os.waitstatus_to_exitcode(status))

    def _exited_with(self, code: int) -> None:
        self.returncode = code
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
        if self._exited is not None and not self._exited.done():
            self._exited.set_result(code)

    async def wait(self) -> int:
        assert self._exited is not None, "watch() first"
        return await asyncio.shield(self._exited)

    def send_signal(self, sig: int) -> None:
        if self.returncode is not None:
            raise ProcessLookupError(self.pid)
        if self._pidfd >= 0:
            signal.pidfd_send_signal(self._pidfd, sig)
        else:
            os.kill(self.pid, sig)
