"""What changed between two views of one type's resources (control/xds/cache.py `View`),
worked out once per pair of views and not once per stream.

Views are shared by every stream that got the same selection, so every stream that moves
between the same two views in a push asks the same question; the answers are memoized by the
views' sequence numbers, in bounded memos.
"""

from __future__ import annotations

from typing import TypeVar

from control.xds.cache import View

_M = TypeVar("_M")

# The names updated between two views. A handful of pairs are live at a time (one per push
# and subscription shape).
_updated_memo: dict[tuple[int, int], frozenset[str]] = {}
# How many pairs the memos below keep. When full, the oldest pair goes, not all of them: a
# memo cleared when full emptied and refilled every couple of minutes, and what it held swung
# between nothing and 256 pairs' worth instead of filling once in the first minutes and
# staying there (tests/benchmarks/xds_soak.py judges the RSS curve after minute 3).
_MEMO_PAIRS = 256


def _remember(memo: dict[tuple[int, int], _M], key: tuple[int, int], value: _M) -> None:
    if len(memo) >= _MEMO_PAIRS:
        del memo[next(iter(memo))]  # dicts keep insertion order: this is the oldest pair
    memo[key] = value


def updated_names(old: View, new: View) -> frozenset[str]:
    """Names in both views whose resource changed."""
    key = (old.seq, new.seq)
    found = _updated_memo.get(key)
    if found is None:
        before = old.by_name
        found = frozenset(
            n for n, r in new.by_name.items() if n in before and before[n].version != r.version
        )
        _remember(_updated_memo, key, found)
    return found


# The changed part of a view, per (sent view, new view): shared by every stream that moves
# between the same two views, so it is worked out and encoded once per push. Bounded like
# _updated_memo.
_part_memo: dict[tuple[int, int], View | None] = {}


def changed_part(old: View, new: View) -> View | None:
    """The resources of `new` that `old` lacks or holds at another version, as a view with
    `new`'s version; None when the whole of `new` must be sent (a name was dropped, or
    nothing would be saved)."""
    key = (old.seq, new.seq)
    if key in _part_memo:
        return _part_memo[key]
    before, after = old.by_name, new.by_name
    part: View | None = None
    if all(n in after for n in before):
        changed = {
            n: r for n, r in after.items() if (b := before.get(n)) is None or b.version != r.version
        }
        if changed and len(changed) < len(after):
            part = View(changed, version=new.version)
    _remember(_part_memo, key, part)
    return part
