"""The heap trimmer collects every generation on the event loop before it trims, so objects in
reference cycles, young or old, are freed in time to be given back."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Callable
from typing import Any

from control.xds.trim import HeapTrimmer


class _Cycle:
    def __init__(self) -> None:
        self.me = self


async def _one_trim(trim: Callable[[], None]) -> HeapTrimmer:
    """A trimmer due after one stream, run until it has trimmed once (or 5 s), then closed."""
    trimmer = HeapTrimmer(trim, busy=lambda: False, after_streams=1, idle=0.01)
    trimmer.stream_opened()
    trimmer.drained()
    for _ in range(500):
        if trimmer.trims:
            break
        await asyncio.sleep(0.01)
    await trimmer.close()
    return trimmer


async def test_cycles_are_collected_on_the_loop_before_the_trim() -> None:
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
        del cycle  # garbage now, but only a collection frees it
        trimmer = await _one_trim(trim)
    finally:
        gc.callbacks.remove(seen)
        gc.set_threshold(*old)
    assert trimmer.trims == 1
    assert alive_at_trim == [False]
    kinds = [(k, g) for k, g, _ in events]
    assert kinds[-2:] == [("collect", 2), ("trim", -1)]
    assert events[-2][2] is threading.main_thread()  # the loop's thread
    assert events[-1][2] is not threading.main_thread()


async def test_old_cycles_are_collected_before_the_trim() -> None:
    """What grpc.aio leaves in a cycle for each call is in the oldest generation by the time a
    long stream closes; measured: the bytes such garbage holds are gone after a trim."""
    import tracemalloc

    old = gc.get_threshold()
    gc.set_threshold(1_000_000, 10, 10)  # no collection of its own in between
    tracemalloc.start()
    try:
        cycles = [_Cycle() for _ in range(1000)]
        for c in cycles:
            c.payload = bytearray(1000)  # type: ignore[attr-defined]
        gc.collect()  # survived every generation: they are old now
        before = tracemalloc.get_traced_memory()[0]
        gone = weakref.ref(cycles[0])
        del cycles, c
        assert gone() is not None  # old garbage: no young collection frees it
        gc.collect(1)
        assert gone() is not None
        trimmer = await _one_trim(lambda: None)
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        gc.set_threshold(*old)
    assert trimmer.trims == 1
    assert gone() is None
    assert before - after > 1000 * 1000, (before, after)
