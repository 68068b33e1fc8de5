"""When the ADS server gives freed memory back to the system: once after a connection storm,
when sending has been idle a little while, never after ordinary pushes.

Answering a new stream has gRPC copy each response (hundreds of kilobytes in a large mesh)
while the stream's own long-lived state is allocated around those copies; glibc returns only
the top of a heap, so what the copies leave between the streams' state stays in the process,
resident, after the storm (1-4 KB per stream at 5,000 proxies). After pushes to the streams
already there it is not worth it: the next push's copies reuse that room, and trimming it
would only have the pages faulted in again (and hold glibc's arena locks while gRPC threads
wait).

Before trimming it collects every generation: with the young threshold raised
(control/gcsettings.py) up to that many young objects caught in reference cycles may still
wait for a collection when the storm ends, and the memory they hold could not be given back
with the rest. The oldest generation too: grpc.aio leaves five objects in a reference cycle
for every call it takes (`_HandlerCallDetails`, its metadata and the closure that looked up
the handler, ~0.6 KB with the user-agent string), and for a stream that lived they are in
the oldest generation by the time it closes, which the interpreter collects only once a
quarter of the long-lived objects are new: in the soak (tests/benchmarks/xds_soak.py, a
proxy restarting every second) not once in minutes, a slope of ~35 KB/min in the RSS. A
full collection walks every object the control plane holds, so it runs only here, once per
`after_streams` new streams, when sending has been idle.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable


class HeapTrimmer:
    """Runs `trim` (glibc's malloc_trim) in a thread `idle` seconds after the send queue
    drained, once at least `after_streams` streams were opened since the last time.

    `busy` is the server's answer to "is anything being sent now?"; it is asked when the
    timer fires, so a drain followed by new sending postpones the trim to the next drain."""

    def __init__(
        self,
        trim: Callable[[], object] | None,
        busy: Callable[[], bool],
        *,
        after_streams: int,
        idle: float,
    ) -> None:
        self._trim = trim if after_streams > 0 else None
        self._busy = busy
        self._after = after_streams
        self._idle = idle
        self._opened = 0  # streams opened since the last trim
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self.trims = 0  # how many times it ran; tests wait on it

    def stream_opened(self) -> None:
        self._opened += 1

    def drained(self) -> None:
        """The send queue drained: schedule a trim if a storm came before."""
        if self._trim is None or self._opened < self._after or self._timer is not None:
            return
        self._timer = asyncio.get_running_loop().call_later(self._idle, self._trim_if_idle)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _trim_if_idle(self) -> None:
        self._timer = None
        if self._trim is None or self._busy() or self._task is not None:
            return  # busy again: the next drain schedules it
        self._opened = 0
        self._task = asyncio.get_running_loop().create_task(self._run(self._trim))

    async def _run(self, trim: Callable[[], object]) -> None:
        try:
            # On the event loop, not in the trim's thread: finalizers of what it frees
            # (asyncio's futures and tasks among them) may touch the loop.
            gc.collect()
            await asyncio.to_thread(trim)  # it walks every heap: not on the event loop
            self.trims += 1
        finally:
            self._task = None
