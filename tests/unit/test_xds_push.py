"""Push debouncing (control/xds/push.py), wire rule 9."""

from __future__ import annotations

import asyncio

import pytest

from control.xds.push import Debouncer, PushLoop

# --- Debouncer (sans-IO) ----------------------------------------------------------------------


def test_rule9_debouncer_nothing_pending() -> None:
    d = Debouncer(quiet=0.1, max_delay=10.0)
    assert not d.pending and d.deadline() is None and d.flush(100.0) is None


def test_rule9_debouncer_fires_after_quiet_period() -> None:
    d = Debouncer(quiet=0.1, max_delay=10.0)
    d.event(1.0, "svc")
    d.event(1.05, "svc")
    d.event(1.08, "endpoints")
    assert d.pending
    assert d.deadline() == pytest.approx(1.18)
    assert d.flush(1.17) is None  # still inside the quiet period of the last event
    flushed = d.flush(1.19)
    assert flushed is not None
    count, reasons, waited = flushed
    assert count == 3 and reasons == {"svc", "endpoints"}
    assert waited == pytest.approx(0.19)
    assert not d.pending and d.flush(5.0) is None  # reset


def test_rule9_debouncer_max_delay_caps_a_steady_stream() -> None:
    d = Debouncer(quiet=0.1, max_delay=1.0)
    t = 0.0
    fired_at = None
    while t < 5.0:
        d.event(t, "churn")
        if (f := d.flush(t)) is not None:
            fired_at = t
            assert f[0] > 1 and f[2] == pytest.approx(1.0)
            break
        t = round(t + 0.05, 2)  # always inside the quiet period
    assert fired_at == pytest.approx(1.0)


def test_rule9_debouncer_default_is_100ms_quiet_10s_max() -> None:
    d = Debouncer()
    assert (d.quiet, d.max_delay) == (0.1, 10.0)


def test_rule9_debouncer_event_without_reason() -> None:
    d = Debouncer(quiet=0.1)
    d.event(0.0)
    flushed = d.flush(0.1)
    assert flushed is not None and flushed[:2] == (1, set())


def test_rule9_debouncer_new_batch_after_flush_starts_fresh() -> None:
    d = Debouncer(quiet=0.1, max_delay=1.0)
    d.event(0.0, "a")
    assert d.flush(0.1) is not None
    d.event(5.0, "b")
    assert d.deadline() == pytest.approx(5.1)
    flushed = d.flush(5.1)
    assert flushed is not None and flushed[:2] == (1, {"b"})


# --- PushLoop (asyncio) -----------------------------------------------------------------------


async def test_rule9_push_loop_coalesces_a_burst_into_one_push() -> None:
    calls: list[tuple[set[str], float]] = []
    done = asyncio.Event()

    async def on_push(reasons: set[str], waited: float) -> None:
        calls.append((reasons, waited))
        done.set()

    async with PushLoop(on_push, quiet=0.05, max_delay=5.0) as loop:
        for i in range(20):
            loop.notify(f"r{i % 3}")
            if i % 5 == 0:
                await asyncio.sleep(0)  # let the loop run mid-burst
        await asyncio.wait_for(done.wait(), timeout=2.0)
        await asyncio.sleep(0.2)  # nothing more arrives without new notifications
    assert len(calls) == 1
    reasons, waited = calls[0]
    assert reasons == {"r0", "r1", "r2"}
    assert waited >= 0.05


async def test_rule9_push_loop_second_burst_second_push_and_survives_errors() -> None:
    calls: list[set[str]] = []
    got = asyncio.Queue[set[str]]()

    async def on_push(reasons: set[str], waited: float) -> None:
        calls.append(reasons)
        await got.put(reasons)
        if len(calls) == 1:
            raise RuntimeError("generator blew up")  # logged; the loop keeps going

    async with PushLoop(on_push, quiet=0.02, max_delay=5.0) as loop:
        loop.notify("a")
        assert await asyncio.wait_for(got.get(), timeout=2.0) == {"a"}
        loop.notify("b")
        loop.notify("c")
        assert await asyncio.wait_for(got.get(), timeout=2.0) == {"b", "c"}
    assert len(calls) == 2


async def test_rule9_push_loop_close_without_events() -> None:
    async def on_push(reasons: set[str], waited: float) -> None:
        raise AssertionError("no push expected")

    loop = PushLoop(on_push, quiet=0.01)
    await loop.start()
    await asyncio.sleep(0.05)
    await asyncio.wait_for(loop.close(), timeout=1.0)
    await loop.close()  # idempotent


async def test_push_loop_closes_when_a_notification_races_the_close() -> None:
    """Regression: waiting with asyncio.wait_for(event.wait(), delay) loses a cancellation
    that arrives with the event (Python 3.11's wait_for returns the inner result then); the
    loop went on waiting and close() hung (a control plane stopping while a stream
    disconnected took the debounce/grace period or forever)."""
    pushed = asyncio.Event()

    async def on_push(reasons: set[str], waited: float) -> None:
        pushed.set()

    loop = PushLoop(on_push, quiet=30.0, max_delay=60.0)
    await loop.start()
    loop.notify("first")  # the loop now waits up to `quiet` for more
    await asyncio.sleep(0.01)
    loop.notify("second")  # wakes the wait ...
    closing = asyncio.create_task(loop.close())  # ... in the same turn as the cancellation
    done, _ = await asyncio.wait([closing], timeout=5)
    assert done, "close() hung"
    assert not pushed.is_set()
