"""The heap trimmer collects the young generations on the event loop before it trims, so
young objects in reference cycles are freed in time to be given back."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from typing import Any

from control.xds.trim import HeapTrimmer


class _Cycle:
    def __init__(self) -> None:
        self.me = self


async def test_young_cycles_are_collected_on_the_loop_before_the_trim() -> None:
    events: list[tuple[str, int, threading.Thread]] = []

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop":
            events.append(("collect", info["generation"], threading.current_thread()))

    cycle = _Cycle()
    gone = weakref.ref(cycle)
    alive_at_trim: list[bool] = []

    def trim() -> None:
        alive_at_trim.append(gone() is not None)
        events.append(("trim", -1, threading.current_thread()))

    old = gc.get_threshold()
    gc.set_threshold(1_000_000, 10, 10)  # no collection of its own in between
    gc.callbacks.append(seen)
    try:
        trimmer = HeapTrimmer(trim, busy=lambda: False, after_streams=1, idle=0.01)
        del cycle  # garbage now, but only a collection frees it
        trimmer.stream_opened()
        trimmer.drained()
        for _ in range(500):
            if trimmer.trims:
                break
            await asyncio.sleep(0.01)
        await trimmer.close()
    finally:
        gc.callbacks.remove(seen)
        gc.set_threshold(*old)
    assert trimmer.trims == 1
    assert alive_at_trim == [False]
    kinds = [(k, g) for k, g, _ in events]
    assert kinds[-2:] == [("collect", 1), ("trim", -1)]
    assert events[-2][2] is threading.main_thread()  # the loop's thread
    assert events[-1][2] is not threading.main_thread()
