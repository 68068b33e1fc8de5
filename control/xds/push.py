"""Push debouncing (wire rule 9; admission of new streams is control/xds/admission.py).

`Debouncer` is sans-IO: it takes `now` and answers when to act. `PushLoop` is the asyncio
adapter: it waits for the debouncer, then calls the push callback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pilotfish_common.lifecycle import Lifecycle
from pilotfish_common.tasks import at_deadlines

logger = logging.getLogger(__name__)


@dataclass
class Debouncer:
    """Coalesce change events: fire once `quiet` seconds pass with no new event, or once
    `max_delay` seconds have passed since the first unflushed event, whichever comes first."""

    quiet: float = 0.1
    max_delay: float = 10.0
    _first: float | None = None
    _last: float | None = None
    events: int = 0
    reasons: set[str] | None = None

    def event(self, now: float, reason: str = "") -> None:
        if self._first is None:
            self._first = now
            self.reasons = set()
        self._last = now
        self.events += 1
        if reason and self.reasons is not None:
            self.reasons.add(reason)

    @property
    def pending(self) -> bool:
        return self._first is not None

    def deadline(self) -> float | None:
        """When the pending events should be flushed, or None when nothing is pending."""
        if self._first is None or self._last is None:
            return None
        return min(self._last + self.quiet, self._first + self.max_delay)

    def flush(self, now: float) -> tuple[int, set[str], float] | None:
        """If due at `now`: (event count, reasons, time since first event) and reset."""
        deadline = self.deadline()
        if deadline is None or now < deadline or self._first is None:
            return None
        result = (self.events, self.reasons or set(), now - self._first)
        self._first = self._last = None
        self.events = 0
        self.reasons = None
        return result


class PushLoop(Lifecycle):
    """Runs `on_push(reasons)` after debounced change notifications."""

    def __init__(
        self,
        on_push: Callable[[set[str], float], Awaitable[None]],
        *,
        quiet: float = 0.1,
        max_delay: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._debouncer = Debouncer(quiet=quiet, max_delay=max_delay)
        self._on_push = on_push
        self._clock = clock
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def notify(self, reason: str = "") -> None:
        self._debouncer.event(self._clock(), reason)
        self._wake.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="push-debounce")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            # gather, not `await task` under suppress(CancelledError): that would also
            # swallow a cancellation of close() itself.
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        await at_deadlines(self._wake, self._debouncer.deadline, self._clock, self._flush)

    async def _flush(self, now: float) -> None:
        flushed = self._debouncer.flush(now)
        if flushed is None:
            return
        count, reasons, waited = flushed
        logger.debug("push after %d events (%.3fs): %s", count, waited, sorted(reasons))
        try:
            await self._on_push(reasons, waited)
        except Exception:
            logger.exception("push failed")
