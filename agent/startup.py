"""Where an agent's start goes: named moments since the agent's code began to run, logged as
one line when the agent first reports ready (and used by tests/benchmarks/ca.py).

Stdlib only, so that `agent/__main__.py` can start the clock before the heavy imports.
"""

from __future__ import annotations

import time


class StartupTimeline:
    """Moments of the start, in milliseconds after `began` (the first line of the agent's
    own code). `began_epoch` is the same instant on the wall clock, for a caller that knows
    when it started the process (the interpreter's own start comes before `began`)."""

    def __init__(self) -> None:
        self.began = time.monotonic()
        self.began_epoch = time.time()
        self.marks: dict[str, float] = {}

    def mark(self, name: str) -> None:
        """Remember the first time `name` happened."""
        self.marks.setdefault(name, (time.monotonic() - self.began) * 1000.0)

    def summary(self) -> str:
        phases = ", ".join(f"{name} {ms:.0f}" for name, ms in self.marks.items())
        return f"start timeline (ms after {self.began_epoch:.6f}): {phases}"
