"""The storm benchmark's memory probe (tests/benchmarks/memstats.py) tells pymalloc's free
room apart from its objects: the room the floor's start-up garbage leaves is why the floor's
RSS per connected proxy reads below what its streams hold (README footnote 16), and the
benchmark prints it from these figures."""

from __future__ import annotations

import gc

from tests.benchmarks.memstats import pymalloc_stats

MB = 1 << 20


def test_freed_objects_that_leave_survivors_behind_become_free_room_not_allocated() -> None:
    gc.collect()
    before = pymalloc_stats()
    # Small objects (pymalloc's, under 512 bytes), one in a thousand kept: every arena they
    # filled keeps a survivor, so pymalloc keeps the arenas and their emptied pools.
    objects = [bytes(100 + i % 300) for i in range(60_000)]
    filled = pymalloc_stats()
    survivors = objects[::1000]
    del objects
    after = pymalloc_stats()

    assert filled["python"] - before["python"] > 10 * MB
    # What was freed is back in the room, and no longer counted as allocated. (Compared
    # with `filled`, not `before`: a process that freed memory earlier has room already,
    # and the new objects go there first.)
    assert filled["python"] - after["python"] > 10 * MB
    assert after["python_free"] - filled["python_free"] > 8 * MB
    assert len(survivors) == 60


def test_free_room_is_taken_before_new_memory() -> None:
    gc.collect()
    survivors = [bytes(100 + i % 300) for i in range(60_000)][::1000]
    room = pymalloc_stats()["python_free"]
    assert room > 8 * MB
    refill = [bytes(100 + i % 300) for i in range(30_000)]
    # About 8 MB of new objects, nearly all of it placed in the room.
    assert room - pymalloc_stats()["python_free"] > 6 * MB
    assert len(refill) == 30_000 and len(survivors) == 60
