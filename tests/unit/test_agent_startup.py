"""The agent's start timeline: first occurrences only, and a summary line that names the
phases in the order they happened."""

from __future__ import annotations

import re

from agent.startup import StartupTimeline


def test_marks_keep_the_first_time_and_the_order() -> None:
    tl = StartupTimeline()
    tl.mark("imports")
    tl.mark("sockets")
    first = tl.marks["imports"]
    tl.mark("imports")
    assert tl.marks["imports"] == first
    assert list(tl.marks) == ["imports", "sockets"]
    assert 0 <= tl.marks["imports"] <= tl.marks["sockets"]
    m = re.fullmatch(
        r"start timeline \(ms after ([\d.]+)\): imports \d+, sockets \d+", tl.summary()
    )
    assert m is not None and abs(float(m.group(1)) - tl.began_epoch) < 1e-3
