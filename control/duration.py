"""Durations as operators write them on the command line: `90s`, `30m`, `1h`, `2d`, `3600`."""

from __future__ import annotations

import re

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd]?)")


def parse_duration(text: str) -> float:
    """Seconds in `text`; ValueError with a readable message when it is not a duration."""
    m = _DURATION.fullmatch(text.strip().lower())
    if m is None:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 30m, 1h, 2d)")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if seconds <= 0:
        raise ValueError(f"{text!r} must be longer than zero")
    return seconds
