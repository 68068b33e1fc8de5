"""Admission of new ADS streams (wire rule 9): as fast as the control plane keeps up with them,
slower when it does not.

A connection storm (every proxy of a mesh reconnecting after a control-plane restart) must not
melt the process, and a flood of streams from one caller must not either. A fixed rate did
both, but pinned every storm at the rate's time even on a machine that could answer it two or
three times as fast. `AdmissionController` is sans-IO: it is told the time, the event loop's
lag, the process's RSS and how many streams wait for a send worker, and answers whether a new
stream may go on now. The rate moves by AIMD between `min_rate` and `max_rate`:

- the streams being answered are a window: while more than `max_queued` streams were admitted
  and are not in sync yet (or wait for a send worker), no new stream is admitted, so admission
  runs at the pace answering does, and the streams already admitted do not wait behind (nor
  compete with) thousands of new ones. A stream leaves the window when every type it
  subscribed to is ACKed, or `settle_timeout` after its admission (a client that never ACKs
  must not hold a place for good);
- event-loop lag above `lag_high` (every read, write and push of every stream waits that long)
  or RSS growing faster than `rss_growth` halves the rate: overload;
- otherwise, while streams wait for the rate (not for the window), it grows by `increase`
  per `interval`.

A flood is thereby held to what the process can answer, and never beyond `max_rate`; on a slow
machine the rate falls to `min_rate` and the streams that waited are counted
(`pilotfish_xds_connections_rate_limited`, beside the rate itself,
`pilotfish_xds_admission_rate`). After a quiet spell the rate starts again from `rate`.

`AdmissionGate` is the asyncio adapter: streams wait in it, first come first served, and one
timer task (running only while some wait) measures the loop's lag and hands out admissions.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    rate: float = 200.0  # new streams per second when a storm starts ...
    burst: float = 400.0  # ... after a burst of this many
    min_rate: float = 20.0  # never slower: a slow machine still takes its proxies
    # Never faster, however well the process keeps up: ten times the start rate, a few times
    # what a 2-core machine answers in a storm (a flood of streams is held to this).
    max_rate: float = 2000.0
    increase: float = 100.0  # added to the rate per interval while streams wait
    decrease: float = 0.5  # the rate's factor on overload
    interval: float = 0.1  # seconds between two decisions on the rate
    lag_high: float = 0.5  # seconds of event-loop lag that mean overload
    max_queued: int = 500  # streams being answered beyond which none is admitted ...
    settle_timeout: float = 10.0  # ... a stream counting at most this long after admission
    # RSS growth that means overload, bytes per second (a stream costs ~30 KB: about what
    # max_rate streams a second cost, so a flood that holds its streams open is slowed) ...
    rss_growth: float = 64.0 * 2**20
    rss_window: float = 1.0  # ... over this many seconds (gRPC allocates in bursts)

    def __post_init__(self) -> None:
        if not 0 < self.min_rate <= self.rate <= self.max_rate:
            raise ValueError(
                f"admission rates must satisfy 0 < min ({self.min_rate:g}) <= start "
                f"({self.rate:g}) <= max ({self.max_rate:g})"
            )
        if self.burst < 1 or not 0 < self.decrease < 1 or not 0 < self.interval <= self.rss_window:
            raise ValueError(
                "admission burst must be >= 1, decrease in (0, 1), 0 < interval <= rss_window"
            )


class AdmissionController:
    """The admission rate and its token bucket, sans-IO (see the module doc)."""

    # Streams waiting again after this many intervals without any: the rate starts afresh.
    _STALE_INTERVALS = 10

    def __init__(self, limits: AdmissionLimits, now: float = 0.0) -> None:
        self.limits = limits
        self.rate = limits.rate
        self._tokens = limits.burst
        self._at = now  # when the tokens were last refilled
        self._decided_at: float | None = None  # start of this interval (None: not begun)
        # (time, RSS) at the decisions of the last rss_window seconds, oldest first.
        self._rss: collections.deque[tuple[float, int]] = collections.deque()
        self._peak_lag = 0.0
        self._rate_bound = False  # a stream found no token in this interval
        # How often the rate went down, and why (for logs and tests).
        self.decreases: collections.Counter[str] = collections.Counter()

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._tokens = min(self.limits.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now

    def try_admit(self, now: float, queued: int) -> bool:
        """Whether one new stream may go on now (it takes a token when it may)."""
        self._refill(now)
        if queued > self.limits.max_queued:
            return False
        if self._tokens < 1.0:
            self._rate_bound = True  # the rate, not the window, held a stream back
            return False
        self._tokens -= 1.0
        return True

    def wait_hint(self, now: float) -> float:
        """Seconds until the next token (0: one is there; the queue may still hold it)."""
        self._refill(now)
        return max(0.0, (1.0 - self._tokens) / self.rate)

    def decision_due(self, now: float) -> bool:
        """Whether `decide` would decide on the rate now (RSS need only be read then)."""
        return self._decided_at is None or now - self._decided_at >= self.limits.interval

    def record_lag(self, lag: float) -> None:
        """How late the event loop ran a timer (seconds); the worst of an interval counts."""
        self._peak_lag = max(self._peak_lag, lag)

    def resume(self, now: float, *, idle: float) -> None:
        """Streams wait again after `idle` seconds in which none did: the measurements of
        before say nothing about now. After a quiet spell (10 intervals) the rate starts
        afresh from `rate`: a flood after a storm does not inherit the storm's rate."""
        self._refill(now)
        if idle >= self._STALE_INTERVALS * self.limits.interval:
            self.rate = self.limits.rate
        self._decided_at, self._peak_lag = None, 0.0
        self._rss.clear()

    def decide(self, now: float, *, rss: int, queued: int, waiting: int) -> str:
        """Decide on the rate once an interval has passed: `rss`, the process's resident
        memory (bytes); `queued`, streams waiting for a send worker; `waiting`, streams
        waiting for admission. Returns why the rate went down ("lag", "rss"), or ""."""
        started = self._decided_at
        samples = self._rss
        if started is None:
            self._decided_at = now
            samples.append((now, rss))
            return ""
        if now - started < self.limits.interval:
            return ""
        self._refill(now)  # the tokens earned so far, at the rate they were earned at
        limits = self.limits
        while len(samples) > 1 and now - samples[1][0] >= limits.rss_window:
            samples.popleft()  # keep one sample at least rss_window old
        growth = 0.0
        if samples and now - samples[0][0] >= limits.rss_window:
            growth = (rss - samples[0][1]) / (now - samples[0][0])
        reason = ""
        if self._peak_lag > limits.lag_high:
            reason = "lag"
        elif growth > limits.rss_growth:
            reason = "rss"
        if reason == "rss":
            samples.clear()  # one growth, one decrease: judged afresh over the next window
        if reason:
            self.rate = max(limits.min_rate, self.rate * limits.decrease)
            self.decreases[reason] += 1
            logger.debug(
                "admission rate down to %.0f/s (%s: lag %.3fs, RSS +%.0f MB/s)",
                self.rate,
                reason,
                self._peak_lag,
                growth / 2**20,
            )
        elif waiting and self._rate_bound:
            # Streams waited for tokens, not for the window: the rate is what holds them.
            self.rate = min(limits.max_rate, self.rate + limits.increase)
        self._decided_at, self._peak_lag, self._rate_bound = now, 0.0, False
        samples.append((now, rss))
        return reason


def process_rss() -> int:
    """This process's resident memory in bytes (0 where /proc is not there). procfs is
    answered from the kernel's memory, never from a disk: the read does not block."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class AdmissionGate:
    """New streams wait here for their admission, first come first served.

    `queued` answers how many streams wait for a send worker; `admit(key)` puts the stream in
    the window until `settled(key)` (or `settle_timeout`); `on_wait` is called for each
    stream that could not go on at once (the rate-limited counter), `on_slowdown(reason)`
    each time the rate goes down ("lag", "rss")."""

    # Most a waiting stream sleeps between two looks at the controller: the lag measurement's
    # resolution, and how soon a drained send queue lets the next streams in.
    _TICK = 0.01

    def __init__(
        self,
        limits: AdmissionLimits,
        *,
        queued: Callable[[], int],
        on_wait: Callable[[], None] = lambda: None,
        on_slowdown: Callable[[str], None] = lambda reason: None,
        rss: Callable[[], int] = process_rss,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self.controller = AdmissionController(limits, clock())
        self._queued = queued
        self._on_wait = on_wait
        self._on_slowdown = on_slowdown
        self._rss = rss
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._pump: asyncio.Task[None] | None = None
        self._idle_since = clock()  # when the last stream stopped waiting
        # Admitted streams not in sync yet, by key, in admission order: key -> admitted at.
        self._unsettled: dict[str, float] = {}

    @property
    def rate(self) -> float:
        """The admission rate now (streams per second)."""
        return self.controller.rate

    @property
    def waiting(self) -> int:
        return sum(1 for f in self._waiters if not f.done())

    def _busy(self, now: float) -> int:
        """Streams being answered: admitted and not in sync (those admitted more than
        settle_timeout ago no longer count), or waiting for a send worker."""
        unsettled = self._unsettled
        expired = now - self.controller.limits.settle_timeout
        while unsettled:
            key = next(iter(unsettled))
            if unsettled[key] > expired:
                break
            del unsettled[key]
        return max(len(unsettled), self._queued())

    def unsettled(self, key: str) -> bool:
        """Whether the stream `key` is still in the window (not settled, not expired)."""
        return key in self._unsettled

    def settled(self, key: str) -> None:
        """The stream `key` is in sync (or gone): it leaves the window."""
        self._unsettled.pop(key, None)

    async def admit(self, key: str) -> None:
        """Return when the stream `key` may go on; it is then in the window until
        `settled(key)`. Cancelling the caller gives its turn up."""
        now = self._clock()
        if not self._waiters and self.controller.try_admit(now, self._busy(now)):
            self._unsettled[key] = now
            return
        self._on_wait()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        if self._pump is None:
            self.controller.resume(now, idle=now - self._idle_since)
            self._pump = asyncio.get_running_loop().create_task(self._run(), name="admission")
        await waiter  # a cancelled caller cancels the future: the pump skips it
        self._unsettled[key] = self._clock()

    async def close(self) -> None:
        pump, self._pump = self._pump, None
        if pump is not None:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
        while self._waiters:
            self._waiters.popleft().cancel()

    async def _run(self) -> None:
        controller, clock, waiters = self.controller, self._clock, self._waiters
        try:
            while True:
                now = clock()
                queued = self._busy(now)
                while waiters:
                    if waiters[0].done():  # its stream went away while waiting
                        waiters.popleft()
                    elif controller.try_admit(now, queued):
                        waiters.popleft().set_result(None)
                        queued += 1  # it joins the window
                    else:
                        break
                if not waiters:
                    return
                delay = min(self._TICK, max(0.001, controller.wait_hint(now)))
                await asyncio.sleep(delay)
                woke = clock()
                controller.record_lag(max(0.0, woke - now - delay))
                if controller.decision_due(woke):
                    reason = controller.decide(
                        woke, rss=self._rss(), queued=self._busy(woke), waiting=len(waiters)
                    )
                    if reason:
                        self._on_slowdown(reason)
        finally:
            self._pump = None
            self._idle_since = clock()
