"""The control plane's garbage collector setting: a larger young generation.

A push allocates a burst of short-lived container objects per stream (decoded requests, the
ACK's bookkeeping, grpc.aio's per-write futures and coroutines). With the interpreter's
default of 700, a push to 1,000 SotW streams ran 2-3 young collections (one push in five
also a middle one), 0.3-7 ms of its ~100 ms of CPU (measured in process, README footnote
14); with 10,000, none. The cost: up to 10,000 more
container objects may wait for a collection (about a megabyte at most), and those in
reference cycles are freed later. The older generations' thresholds stay as the interpreter
has them.

The setting belongs to the process, so a control plane applies it at start and puts the
previous one back when it closes (tests and benchmarks run control planes inside processes
that do other work). Control planes that overlap in one process share it: while any of them
runs, the one started last decides, and the first one's value comes back only when the last
closes.
"""

from __future__ import annotations

import gc
import logging

logger = logging.getLogger(__name__)

# What ControlPlaneOptions.gc_young_threshold defaults to.
DEFAULT_YOUNG_THRESHOLD = 10_000

# The YoungThreshold objects applied now, oldest first, and the thresholds from before the
# first of them.
_applied: list[YoungThreshold] = []
_before: tuple[int, int, int] | None = None


class YoungThreshold:
    """Sets the collector's generation-0 threshold while applied. `threshold` None leaves the
    interpreter's setting alone (apply and restore do nothing)."""

    __slots__ = ("threshold",)

    def __init__(self, threshold: int | None) -> None:
        # 0 would switch the collector off altogether (gc.set_threshold), which is not
        # what a young-generation size means.
        if threshold is not None and threshold < 1:
            raise ValueError(f"gc young threshold must be at least 1, not {threshold}")
        self.threshold = threshold

    def apply(self) -> None:
        global _before
        if self.threshold is None or self in _applied:
            return
        current = gc.get_threshold()
        if not _applied:
            _before = current
        _applied.append(self)
        gc.set_threshold(self.threshold, current[1], current[2])
        logger.debug("gc thresholds %s (were %s)", gc.get_threshold(), current)

    def restore(self) -> None:
        global _before
        if self not in _applied:
            return
        _applied.remove(self)
        _, middle, old = gc.get_threshold()
        if _applied:
            young = _applied[-1].threshold
            assert young is not None  # only set thresholds are applied
            gc.set_threshold(young, middle, old)
        elif _before is not None:
            gc.set_threshold(*_before)
            _before = None
