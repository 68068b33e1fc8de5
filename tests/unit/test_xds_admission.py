"""Adaptive admission of new ADS streams (control/xds/admission.py), wire rule 9: the
sans-IO controller driven by hand (no sockets, no clock), and its asyncio gate."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from control.xds.admission import AdmissionController, AdmissionGate, AdmissionLimits

LIMITS = AdmissionLimits(
    rate=100.0,
    burst=10.0,
    min_rate=10.0,
    max_rate=1000.0,
    increase=50.0,
    decrease=0.5,
    interval=0.125,  # exact in binary: the intervals add up without rounding
    lag_high=0.2,
    max_queued=50,
    rss_growth=100.0 * 2**20,
    rss_window=0.5,
)
MB = 2**20


def _admitted(ctl: AdmissionController, now: float, queued: int = 0, most: int = 10_000) -> int:
    n = 0
    while n < most and ctl.try_admit(now, queued):
        n += 1
    return n


def _intervals(
    ctl: AdmissionController,
    start: float,
    count: int,
    *,
    lag: float = 0.0,
    rss: int = 100 * MB,
    rss_step: int = 0,
    queued: int = 0,
    waiting: int = 100,
) -> float:
    """`count` intervals of the same conditions, as the gate would report them; returns the
    time after the last one."""
    now = start
    for _ in range(count):
        now += LIMITS.interval
        if waiting:  # the waiting streams take every token there is
            _admitted(ctl, now, queued)
        ctl.record_lag(lag)
        rss += rss_step
        ctl.decide(now, rss=rss, queued=queued, waiting=waiting)
    return now


def test_rule9_burst_then_the_rate() -> None:
    ctl = AdmissionController(LIMITS, now=0.0)
    assert _admitted(ctl, 0.0) == 10  # the burst
    assert not ctl.try_admit(0.0, 0)
    assert ctl.wait_hint(0.0) == pytest.approx(0.01)  # one token per 1/100 s
    assert _admitted(ctl, 0.05) == 5
    assert _admitted(ctl, 100.0) == 10  # refilled to the burst, never beyond


def test_rule9_a_full_send_queue_holds_new_streams_whatever_the_tokens() -> None:
    ctl = AdmissionController(LIMITS, now=0.0)
    assert not ctl.try_admit(0.0, queued=51)
    assert _admitted(ctl, 0.0, queued=50) == 10  # at the bound: still admitted


def test_rule9_event_loop_lag_slows_admission_down_to_the_minimum() -> None:
    ctl = AdmissionController(LIMITS, now=0.0)
    now = _intervals(ctl, 0.0, 1)  # opens the first interval
    rates = []
    for _ in range(6):
        now = _intervals(ctl, now, 1, lag=0.5)
        rates.append(ctl.rate)
    assert rates == [50.0, 25.0, 12.5, 10.0, 10.0, 10.0]
    assert ctl.decreases["lag"] == 6
    # At the minimum the stream still gets in, at that pace.
    _admitted(ctl, now)
    assert _admitted(ctl, now + 1.0) == 10


def test_rule9_only_the_worst_lag_of_an_interval_counts_and_small_lag_does_not() -> None:
    ctl = AdmissionController(LIMITS, now=0.0)
    now = _intervals(ctl, 0.0, 1)
    now = _intervals(ctl, now, 3, lag=0.19)  # under lag_high: grows
    assert ctl.rate == 250.0
    ctl.record_lag(0.3)
    ctl.record_lag(0.0)  # a later good sample does not hide the bad one
    ctl.decide(now + LIMITS.interval, rss=100 * MB, queued=0, waiting=100)
    assert ctl.rate == 125.0


def test_rule9_admission_recovers_after_the_lag_and_stops_at_the_maximum() -> None:
    ctl = AdmissionController(LIMITS, now=0.0)
    now = _intervals(ctl, 0.0, 1)
    now = _intervals(ctl, now, 10, lag=1.0)
    assert ctl.rate == LIMITS.min_rate
    now = _intervals(ctl, now, 4)
    assert ctl.rate == LIMITS.min_rate + 4 * LIMITS.increase  # additive increase
    now = _intervals(ctl, now, 100)
    assert ctl.rate == LIMITS.max_rate


def test_rule9_no_increase_without_waiting_streams_or_with_a_full_queue() -> None:
    ctl = AdmissionController(LIMITS, now=0.0)
    now = _intervals(ctl, 0.0, 1)
    now = _intervals(ctl, now, 5, waiting=0)
    assert ctl.rate == LIMITS.rate
    now = _intervals(ctl, now, 5, queued=LIMITS.max_queued + 1)
    assert ctl.rate == LIMITS.rate


def test_rule9_fast_rss_growth_slows_admission_judged_over_a_window() -> None:
    ctl = AdmissionController(LIMITS, now=0.0)
    now = _intervals(ctl, 0.0, 1)
    # One jump of 40 MB in an interval (gRPC allocating a burst), then flat: 80 MB/s over
    # the 0.5 s window, under the 100 MB/s bound.
    now = _intervals(ctl, now, 1, rss_step=40 * MB)
    now = _intervals(ctl, now, 4, rss=140 * MB)
    assert ctl.decreases["rss"] == 0 and ctl.rate == LIMITS.rate + 5 * LIMITS.increase
    # 20 MB per 0.125 s is 160 MB/s: once the window has seen it, the rate halves, and the
    # window starts afresh (one decrease per window of growth, not one per interval).
    rate = ctl.rate
    now = _intervals(ctl, now, 4, rss=140 * MB, rss_step=20 * MB)
    # (two increases, the decrease when 0.5 s of it is seen, then an increase again)
    assert ctl.decreases["rss"] == 1
    assert ctl.rate == (rate + 2 * LIMITS.increase) / 2 + LIMITS.increase
    now = _intervals(ctl, now, 4, rss=220 * MB, rss_step=20 * MB)
    assert ctl.decreases["rss"] == 2
    # 5 MB per 0.125 s (40 MB/s) is growth the process keeps up with.
    rate = ctl.rate
    _intervals(ctl, now, 8, rss=300 * MB, rss_step=5 * MB)
    assert ctl.decreases["rss"] == 2 and ctl.rate == rate + 8 * LIMITS.increase


def test_rule9_after_a_quiet_spell_the_rate_starts_again_from_the_start_rate() -> None:
    ctl = AdmissionController(LIMITS, now=0.0)
    now = _intervals(ctl, 0.0, 30)
    assert ctl.rate > LIMITS.rate
    ctl.resume(now + 0.5, idle=0.5)  # a short pause: the storm goes on
    assert ctl.rate > LIMITS.rate
    ctl.resume(now + 60.0, idle=60.0)
    assert ctl.rate == LIMITS.rate


def test_rule9_the_rate_and_the_admissions_never_exceed_the_bounds() -> None:
    """Random conditions for a simulated minute: the rate stays within [min, max], and no
    window of time admits more than the burst plus max_rate times its length (a flood that
    the process answers perfectly is still held to max_rate)."""
    rng = random.Random(23)
    ctl = AdmissionController(LIMITS, now=0.0)
    now, rss = 0.0, 100 * MB
    admissions: list[float] = []
    while now < 60.0:
        now += rng.choice((0.001, 0.01, 0.05))
        ctl.record_lag(rng.choice((0.0, 0.0, 0.0, 0.01, 0.3)))
        rss += rng.choice((0, 0, MB, 30 * MB))
        queued = rng.choice((0, 10, 49, 60))
        for _ in range(rng.randrange(0, 50)):
            if ctl.try_admit(now, queued):
                admissions.append(now)
        if ctl.decision_due(now):
            ctl.decide(now, rss=rss, queued=queued, waiting=rng.randrange(0, 1000))
        assert LIMITS.min_rate <= ctl.rate <= LIMITS.max_rate
    assert admissions, "the random walk never admitted anything"
    for i, t in enumerate(admissions):
        within = sum(1 for u in admissions[i : i + 2000] if u - t <= 1.0)
        assert within <= LIMITS.burst + LIMITS.max_rate * 1.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_rate": 0.0},
        {"rate": 10.0, "min_rate": 20.0},
        {"rate": 2000.0, "max_rate": 1000.0},
        {"burst": 0.5},
        {"decrease": 1.0},
    ],
)
def test_rule9_inconsistent_limits_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="admission"):
        AdmissionLimits(**kwargs)  # type: ignore[arg-type]


# --- the asyncio gate ---------------------------------------------------------------------


async def test_rule9_gate_admits_the_burst_then_the_rest_in_order_and_counts_them() -> None:
    waited = []
    gate = AdmissionGate(
        AdmissionLimits(rate=200.0, burst=5.0, min_rate=200.0, max_rate=200.0),
        queued=lambda: 0,
        on_wait=lambda: waited.append(1),
        rss=lambda: 0,
    )
    order: list[int] = []

    async def stream(i: int) -> None:
        await gate.admit(f"s{i}")
        order.append(i)

    started = time.monotonic()
    await asyncio.wait_for(asyncio.gather(*(stream(i) for i in range(25))), 5.0)
    elapsed = time.monotonic() - started
    assert order == list(range(25))  # first come first served
    assert len(waited) == 20  # all but the burst waited, and were counted
    assert elapsed >= 19 / 200.0  # 20 more at 200/s: the last one no sooner than ~0.1 s
    await gate.close()


async def test_rule9_gate_slows_down_while_the_event_loop_lags_and_recovers_after() -> None:
    """A task that blocks the loop for 0.3 s at a time (as a slow generator or a starved
    process would) is lag the gate measures on its own timer: the rate goes down while it
    runs, and up again once it stops."""
    limits = AdmissionLimits(rate=100.0, burst=1.0, min_rate=10.0, max_rate=1000.0)
    gate = AdmissionGate(limits, queued=lambda: 0, rss=lambda: 0)
    hogging = True

    async def hog() -> None:
        while hogging:
            time.sleep(0.3)  # blocks the event loop on purpose
            await asyncio.sleep(0)

    hogger = asyncio.create_task(hog())
    await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.gather(*(gate.admit(f"a{i}") for i in range(10))), 20.0)
    hogging = False
    await hogger
    slowed = gate.rate
    assert slowed < limits.rate and gate.controller.decreases["lag"] >= 2
    # No lag now: 200 waiting streams get in ever faster.
    await asyncio.wait_for(asyncio.gather(*(gate.admit(f"b{i}") for i in range(200))), 20.0)
    assert gate.rate > slowed
    await gate.close()


async def test_rule9_gate_holds_streams_while_the_send_queue_is_full() -> None:
    queued = 1000
    gate = AdmissionGate(
        AdmissionLimits(rate=1000.0, burst=100.0, max_queued=10),
        queued=lambda: queued,
        rss=lambda: 0,
    )
    waiter = asyncio.ensure_future(gate.admit("s"))
    await asyncio.sleep(0.1)
    assert not waiter.done() and gate.waiting == 1
    queued = 0  # the send workers caught up
    await asyncio.wait_for(waiter, 1.0)
    await gate.close()


async def test_rule9_a_stream_that_leaves_while_waiting_gives_its_turn_up() -> None:
    gate = AdmissionGate(
        AdmissionLimits(rate=20.0, burst=1.0, min_rate=20.0, max_rate=20.0),
        queued=lambda: 0,
        rss=lambda: 0,
    )
    await gate.admit("first")  # the burst
    leaving = asyncio.ensure_future(gate.admit("leaving"))
    staying = asyncio.ensure_future(gate.admit("staying"))
    await asyncio.sleep(0)
    leaving.cancel()
    await asyncio.wait_for(staying, 1.0)  # the next token (1/20 s) goes to it
    assert leaving.cancelled()
    assert gate.waiting == 0
    assert not gate.unsettled("leaving") and gate.unsettled("staying")
    await gate.close()


async def test_rule9_gate_window_holds_new_streams_until_earlier_ones_settle_or_expire() -> None:
    """Streams admitted and not in sync fill the window: the next one waits until one of
    them settles; one that never does (a client that never ACKs) leaves it at the timeout."""
    limits = AdmissionLimits(rate=1000.0, burst=100.0, max_queued=2, settle_timeout=0.3)
    gate = AdmissionGate(limits, queued=lambda: 0, rss=lambda: 0)
    for key in ("a", "b", "c"):  # the window is full once more than max_queued are in it
        await asyncio.wait_for(gate.admit(key), 1.0)
    held = asyncio.ensure_future(gate.admit("d"))
    await asyncio.sleep(0.05)
    assert not held.done()
    gate.settled("a")
    await asyncio.wait_for(held, 1.0)
    assert gate.unsettled("d") and not gate.unsettled("a")
    # b, c and d never settle: e waits for the oldest of them to expire.
    expiring = asyncio.ensure_future(gate.admit("e"))
    await asyncio.sleep(0.05)
    assert not expiring.done()
    await asyncio.wait_for(expiring, 2.0)
    assert not gate.unsettled("b")
    await gate.close()
