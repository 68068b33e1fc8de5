"""Plain-text tables for pilotfish-ctl: left-aligned columns, two spaces apart, no colour.

On a terminal the widest columns are shortened (with "…") until the table fits its width;
piped output is never shortened, so `grep`/`awk` see whole values.
"""

from __future__ import annotations

from collections.abc import Sequence

_GAP = "  "
_MIN_COLUMN = 8


def render(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int | None = None) -> str:
    """The table as text ending in a newline; `width` = None means never shorten."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    if width is not None:
        widths = _fit(widths, headers, width)
    lines = []
    for row in (headers, *rows):
        cells = [_clip(c, w) for c, w in zip(row, widths, strict=True)]
        # The last column is not padded: no trailing spaces in piped output.
        cells[-1] = cells[-1].rstrip()
        lines.append(_GAP.join(c.ljust(w) for c, w in zip(cells[:-1], widths, strict=False)))
        lines[-1] = (lines[-1] + _GAP + cells[-1]) if len(cells) > 1 else cells[-1]
    return "\n".join(lines) + "\n"


def _fit(widths: list[int], headers: Sequence[str], width: int) -> list[int]:
    """Shrink the widest column, one character at a time, until the row fits."""
    widths = list(widths)
    floor = [max(len(h), _MIN_COLUMN) for h in headers]
    while sum(widths) + len(_GAP) * (len(widths) - 1) > width:
        candidates = [i for i, w in enumerate(widths) if w > floor[i]]
        if not candidates:
            break
        widest = max(candidates, key=lambda i: widths[i])
        widths[widest] -= 1
    return widths


def _clip(cell: str, width: int) -> str:
    return cell if len(cell) <= width else cell[: max(0, width - 1)] + "…"
