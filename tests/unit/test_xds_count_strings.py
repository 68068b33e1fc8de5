"""The count strings streams share (control/xds/state.py CountStrings): nonces and delta
version numbers are one string per count for every stream at that count, and the table that
shares them is bounded, unlike the interpreter's table of interned strings that held them
before (issue 23: a step of 1-2 MB in the soak's RSS each time that table grew).

Measured with tracemalloc: the bytes allocated by the stream state machines and retained.
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import pytest

import control.xds.state
from control.xds.delta import DeltaStream
from control.xds.state import CountStrings, NonceSource
from tests.unit.test_xds_delta import EDS, Build, dreq, dstart, rset, status_of

STATE_PY = str(Path(control.xds.state.__file__))


def _retained(snapshot: tracemalloc.Snapshot, *files: str) -> int:
    """Bytes still allocated, traced to lines of `files`."""
    filters = [tracemalloc.Filter(True, f) for f in files]
    return sum(s.size for s in snapshot.filter_traces(filters).statistics("filename"))


def _wire_copy(s: str) -> str:
    """The nonce as a client sends it back: a string object of its own."""
    copy = "".join(list(s))
    assert copy == s and copy is not s
    return copy


def test_the_table_holds_at_most_its_slots_however_far_counts_go() -> None:
    table = CountStrings(1024)
    gc.collect()
    tracemalloc.start()
    try:
        for n in range(1, 200_001):
            table.get(n)
        gc.collect()
        snapshot = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    assert table.held() == 1024
    # 1,024 strings of six digits are ~56 KB; one string per count would be 11 MB.
    kept = _retained(snapshot, STATE_PY)
    assert kept < 100_000, f"{kept} bytes kept for 200,000 counts"
    assert table.get(200_000) == "200000" and table.get(7) == "7"


def test_a_count_is_one_string_until_its_slot_is_taken() -> None:
    table = CountStrings(8)
    first = table.get(3)
    assert table.get(3) is first
    assert table.get(11) == "11"  # the same slot: it takes it over
    again = table.get(3)
    assert again == "3" and again is not first


@pytest.mark.parametrize("slots", [0, 1000, -4])
def test_table_size_must_be_a_power_of_two(slots: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        CountStrings(slots)


def test_nonce_sources_share_strings_and_keep_their_prefix() -> None:
    a, b = NonceSource(), NonceSource()
    assert [a.next() for _ in range(3)] == ["1", "2", "3"]
    assert b.next() == "1" and b.next() == "2"
    d, e = NonceSource(), NonceSource()
    assert d.next() is e.next()
    p = NonceSource("s1-")
    assert p.next() == "s1-1"


def test_streams_in_step_hold_one_copy_of_their_nonces_and_versions() -> None:
    """1,000 delta streams pushed in step: the nonce, ACKed nonce and version strings they
    hold are the same objects, and what the state machines retain for them does not grow
    with the number of streams beyond the streams' own records."""
    b = Build()
    names = [f"c{i}" for i in range(5)]
    streams = [DeltaStream(f"s{i}") for i in range(1000)]
    res = rset(*(b.cla(n) for n in names))
    for s in streams:
        dstart(s, EDS, res, names)
    pushes = 40
    gc.collect()
    tracemalloc.start()
    try:
        for rev in range(2, pushes + 2):
            res = rset(*(b.cla(n, rev if n == "c0" else 1) for n in names))
            for s in streams:
                (resp,) = s.push({EDS: res})
                s.receive(dreq(EDS, nonce=_wire_copy(resp.nonce)))
        gc.collect()
        snapshot = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    # Everything the 40 pushes left allocated: ~10 bytes per stream with the strings shared,
    # ~110 with a copy of them per stream.
    kept = sum(s.size for s in snapshot.statistics("filename"))
    assert kept / len(streams) < 40, f"{kept / len(streams):.0f} bytes per stream retained"
    rows = [status_of(s, EDS) for s in streams]
    first = rows[0]
    assert first.sent_nonce == first.acked_nonce == str(pushes + 1)
    for row in rows:
        assert row.sent_nonce is first.sent_nonce
        assert row.acked_nonce is first.sent_nonce  # ours, not the client's copy
        assert row.sent_version is first.sent_version


def test_the_table_is_full_from_the_start() -> None:
    """Streams reach count n after about n pushes; a table filled as counts arrived grew for
    its first `slots` pushes (minutes into the soak). Counting far past the table's size
    must leave it holding what it held when made: its strings are replaced by ones no
    bigger, a byte or two at most."""
    gc.collect()
    tracemalloc.start()
    try:
        table = CountStrings(1024)
        made = tracemalloc.get_traced_memory()[0]
        for n in range(1, 20_000):
            table.get(n)
        gc.collect()
        counted = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert table.get(5) == "5" and table.get(1024 + 5) == "1029"
    # Filled as counts came, the table grew by ~52 KB (1,024 strings) past `made`.
    assert counted - made < 4 * 1024, f"{counted - made} bytes more after counting"
