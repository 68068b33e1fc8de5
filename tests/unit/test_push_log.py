"""The push log of /debug/pushz (control/pipeline.py's PushLog): the last pushes, oldest first,
in storage that does not grow with the pushes (measured with tracemalloc, not timed)."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from control.pipeline import PUSH_LOG_SIZE, PushLog, PushRecord


def _push(log: PushLog, seq: int, snapshot: float | None = 5.0) -> None:
    log.append(
        seq,
        1000.0 + seq,
        1.7e9 + seq,
        {"config", "registry"} if seq % 2 else ["config"],
        0.1 * seq,
        bool(seq % 3),
        seq * 7,
        snapshot,
    )


def test_holds_the_last_pushes_oldest_first() -> None:
    log = PushLog(4)
    assert list(log) == [] and len(log) == 0
    for seq in range(1, 7):
        _push(log, seq, None if seq == 6 else 5.0 + seq)
    assert len(log) == 4
    assert [r.seq for r in log] == [3, 4, 5, 6]
    first, *_, last = log
    assert first == PushRecord(
        3, 1003.0, 1.7e9 + 3, ("config", "registry"), 0.1 * 3, False, 21, 8.0
    )
    assert last.config_snapshot is None and last.eds_only is False and last.reasons == ("config",)
    assert last.as_json()["config_snapshot_monotonic"] is None


def test_default_size_is_the_documented_one() -> None:
    log = PushLog()
    for seq in range(PUSH_LOG_SIZE + 10):
        _push(log, seq)
    assert len(log) == PUSH_LOG_SIZE == 1024
    assert next(iter(log)).seq == 10


def test_rejects_an_empty_log() -> None:
    with pytest.raises(ValueError):
        PushLog(0)


def test_reasons_are_shared_between_pushes() -> None:
    log = PushLog(8)
    for _ in range(8):
        _push(log, 1)  # the same reasons each time, from a fresh set
    first, *rest = list(log)
    assert all(r.reasons is first.reasons for r in rest)


def _net_allocated(log: PushLog, first_seq: int, pushes: int) -> int:
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    for seq in range(first_seq, first_seq + pushes):
        _push(log, seq)
    gc.collect()
    return tracemalloc.get_traced_memory()[0] - before


def test_pushes_allocate_nothing_that_stays() -> None:
    # The soak's RSS rose for as long as the log filled (1,024 pushes, minutes at its rate):
    # pushes into an empty log must cost no more memory than pushes into a full one, and
    # neither any. Big seq numbers and floats are new objects every push, as in the server.
    log = PushLog(PUSH_LOG_SIZE)
    tracemalloc.start()
    try:
        filling = _net_allocated(log, 10**9, PUSH_LOG_SIZE)
        full = _net_allocated(log, 2 * 10**9, 2 * PUSH_LOG_SIZE)
    finally:
        tracemalloc.stop()
    # A few hundred bytes of slack: the interpreter's free lists and the shared reason tuples
    # of the first pushes, not 270 bytes for each of 1,024 pushes (about 280 KB).
    assert filling < 2048, filling
    assert full < 512, full
