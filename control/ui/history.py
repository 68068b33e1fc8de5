"""Which snapshots the scraper keeps, and which pair a window reads (sans-IO).

The page asks for the traffic of the last N seconds (10 s … 10 min). Keeping every scrape
for ten minutes would hold hundreds of copies of every agent's series, so older snapshots are
thinned out: a snapshot survives while its neighbours are further apart than a fraction of
its age. What stays is about log-spaced (dense for the last seconds, a few for the last
minutes), a few dozen snapshots whatever the scrape interval, and any window finds a
snapshot within about that fraction of its length.
"""

from __future__ import annotations

from collections import deque

from control.ui.samples import Snapshot

# A snapshot may be dropped when its neighbours are closer than this share of its age.
SPACING = 0.125


class SnapshotHistory:
    def __init__(self, horizon: float = 600.0, spacing: float = SPACING) -> None:
        self.horizon = horizon  # nothing older than this (seconds) is kept, but one
        self._spacing = spacing
        self._snapshots: deque[Snapshot] = deque()

    def __len__(self) -> int:
        return len(self._snapshots)

    @property
    def latest(self) -> Snapshot | None:
        return self._snapshots[-1] if self._snapshots else None

    def add(self, snapshot: Snapshot) -> None:
        if self._snapshots and snapshot.at <= self._snapshots[-1].at:
            return  # a clock that went back: keep the order the windows rely on
        self._snapshots.append(snapshot)
        now = snapshot.at
        # The oldest snapshot past the horizon is kept while the next one is inside it, so
        # the longest window always has a start.
        while len(self._snapshots) > 2 and now - self._snapshots[1].at >= self.horizon:
            self._snapshots.popleft()
        if len(self._snapshots) < 3:
            return
        kept: list[Snapshot] = [self._snapshots[0]]
        items = list(self._snapshots)
        for i in range(1, len(items) - 1):
            age = now - items[i].at
            gap = items[i + 1].at - kept[-1].at
            if gap > self._spacing * age:
                kept.append(items[i])
        kept.append(items[-1])
        if len(kept) != len(items):
            self._snapshots = deque(kept)

    def window(self, seconds: float) -> tuple[Snapshot, Snapshot] | None:
        """(start, end) for the last `seconds`: the latest snapshot and the newest one at least
        `seconds` older, or the oldest one when none is that old yet. None with fewer than two
        snapshots."""
        if len(self._snapshots) < 2:
            return None
        end = self._snapshots[-1]
        start = self._snapshots[0]
        for s in reversed(self._snapshots):
            if end.at - s.at >= seconds:
                start = s
                break
        return start, end
