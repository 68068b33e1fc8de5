"""Background tasks: stopping them, and the step of a timer loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any


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
