"""The memos of control/xds/viewdiff.py (the changed part of an endpoint push, the names updated
between two views): bounded, and once full they stay full, holding the same memory, instead
of emptying and refilling (measured with tracemalloc, not timed)."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Iterator

import pytest

from control.xds import viewdiff
from control.xds.cache import Resource, View
from protos.typeurls import ENDPOINT

_NAMES = [f"outbound|80||svc{i}.default.svc.cluster.local" for i in range(20)]


def _views() -> Iterator[tuple[View, View]]:
    """Consecutive pushes: one assignment of twenty changes each time, as in the soak."""
    versions = dict.fromkeys(_NAMES, 0)
    old = _view(versions)
    n = 0
    while True:
        n += 1
        versions[_NAMES[n % len(_NAMES)]] = n
        new = _view(versions)
        yield old, new
        old = new


def _view(versions: dict[str, int]) -> View:
    return View(
        {
            name: Resource(name, f"{name}-{v}", ENDPOINT, bytes(300) + str(v).encode())
            for name, v in versions.items()
        }
    )


@pytest.fixture(autouse=True)
def _empty_memos() -> Iterator[None]:
    viewdiff._part_memo.clear()
    viewdiff._updated_memo.clear()
    yield
    viewdiff._part_memo.clear()
    viewdiff._updated_memo.clear()


def test_changed_part_is_the_changed_assignment() -> None:
    old, new = next(_views())
    part = viewdiff.changed_part(old, new)
    assert part is not None and list(part.by_name) == [_NAMES[1]]
    assert part.version == new.version
    assert viewdiff.changed_part(old, new) is part  # the second stream gets the same one


def test_full_memos_stay_full_and_hold_constant_memory() -> None:
    pairs = _views()
    size = viewdiff._MEMO_PAIRS
    held: list[int] = []
    lengths: set[int] = set()
    # Traced from the start: what the first entries hold must be seen going when they do.
    tracemalloc.start()
    try:
        # Full, and then some: a dict that drops its oldest key as it takes a new one grows
        # its table once more (to three times what it holds) before it settles.
        for _ in range(2 * size):
            old, new = next(pairs)
            viewdiff.changed_part(old, new)
            viewdiff.updated_names(old, new)
        del old, new
        for _ in range(6):
            for _ in range(size // 4):
                old, new = next(pairs)
                assert viewdiff.changed_part(old, new) is not None
                viewdiff.updated_names(old, new)
                lengths.add(len(viewdiff._part_memo))
                lengths.add(len(viewdiff._updated_memo))
            del old, new
            gc.collect()
            held.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert lengths == {size}
    # Each entry holds a changed assignment (about 0.5 KB with its view): a memo emptied
    # when full held a quarter of its 256 entries' worth less at one of these points.
    assert max(held) - min(held) < 8 * 1024, held
