"""The FIFO Envoy's file logger writes HTTP metrics records to, `<workdir>/METRICS`, read on
the event loop (protos/telemetry.py has the record format; records.py reads it).

The FIFO is created 0600 (owned by Envoy's user when Envoy runs as another: what is written
there becomes metrics, so only Envoy may write) and opened by `open()` before Envoy starts,
read and write, non-blocking: Envoy opens the path for writing when it loads a logger, and
an open for writing of a FIFO nobody reads would block Envoy's main thread. Holding the write
end too means the reader never sees an end of file, across Envoy restarts.

Reads are non-blocking from the loop's reader callback, at most `READS_PER_WAKEUP` chunks a
wakeup, so a burst (Envoy flushes every second) is spread over several loop iterations
instead of holding the loop. The pipe is enlarged to hold a few seconds of records, so Envoy's
flush thread is not stalled by a busy agent. Only light modules are imported here: the agent
opens the FIFO before its heavy imports (agent/launch.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

logger = logging.getLogger(__name__)

READ_SIZE: Final = 64 * 1024
READS_PER_WAKEUP: Final = 4
# What an unprivileged process may ask for by default (/proc/sys/fs/pipe-max-size).
PIPE_SIZE: Final = 1024 * 1024


class MetricsFifo:
    """The FIFO: `open()` (blocking, a few syscalls, at startup), `start(consumer)` to hand
    every chunk read to `consumer`, `close()`."""

    def __init__(self, path: Path, owner: int | None = None) -> None:
        self.path = path.absolute()
        self._owner = owner
        self._fd: int | None = None
        self._consumer: Callable[[bytes], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.bytes_read = 0

    def open(self) -> None:
        """Create and open the FIFO (idempotent); OSError when it cannot be."""
        if self._fd is not None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a stale one from a previous run
        # Created with its final mode: no moment at which another user could open it.
        os.mkfifo(self.path, 0o600)
        if self._owner is not None:
            os.chown(self.path, self._owner, -1)
        fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        except OSError as e:  # a lower system limit: the default 64 KiB still works
            logger.debug("metrics FIFO keeps its default size: %s", e)
        self._fd = fd

    def start(self, consumer: Callable[[bytes], None]) -> None:
        self.open()
        assert self._fd is not None
        self._consumer = consumer
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._fd, self._readable)
        logger.info("metrics records read from %s", self.path)

    def _readable(self) -> None:
        assert self._fd is not None and self._consumer is not None
        for _ in range(READS_PER_WAKEUP):
            try:
                data = os.read(self._fd, READ_SIZE)
            except BlockingIOError:
                return
            except OSError as e:  # not expected of a FIFO we hold both ends of
                logger.error("metrics FIFO %s: read failed, no longer read: %s", self.path, e)
                self._stop_reading()
                return
            if not data:
                return
            self.bytes_read += len(data)
            self._consumer(data)

    def _stop_reading(self) -> None:
        if self._loop is not None and self._fd is not None:
            self._loop.remove_reader(self._fd)
        self._loop = None

    async def close(self) -> None:
        self._stop_reading()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
