"""Stopping background tasks."""

from __future__ import annotations

import asyncio
import contextlib
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
