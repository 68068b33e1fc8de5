"""Background tasks: stopping them, and timer loops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn


async def cancel(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel `tasks` (None entries are skipped) and wait until each has finished, so that
    nothing it holds outlives the owner's close(). All are cancelled before the first wait:
    a slow one does not hold back the others' cancellation."""
    live = [t for t in tasks if t is not None]
    for t in live:
        t.cancel()
    for t in live:
        with contextlib.suppress(asyncio.CancelledError):
            await t


async def deadline_passed(
    wake: asyncio.Event, deadline: float | None, clock: Callable[[], float]
) -> bool:
    """One step of a timer loop: True when `deadline` (on `clock`) has passed, else wait until
    it passes or `wake` is set and return False, so the caller works the deadline out again.
    None waits for `wake` alone.

    asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancellation that arrives
    together with the event, and the owner's close() would then wait out the deadline."""
    if deadline is not None:
        delay = deadline - clock()
        if delay <= 0:
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await wake.wait()
            wake.clear()
        return False
    await wake.wait()
    wake.clear()
    return False


async def at_deadlines(
    wake: asyncio.Event,
    deadline: Callable[[], float | None],
    clock: Callable[[], float],
    act: Callable[[float], Awaitable[object]],
) -> NoReturn:
    """A timer loop for a task's life: each time `deadline()` (on `clock`; None: nothing is
    due) has passed, `await act(now)`. The deadline is asked again after every act and every
    time `wake` is set, so an owner whose next deadline moves (a new event to debounce, a new
    entry to expire) sets `wake`; `act` must move it past `now` or the loop spins."""
    while True:
        if await deadline_passed(wake, deadline(), clock):
            await act(clock())
