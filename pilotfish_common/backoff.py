"""Jittered exponential backoff, sans-IO."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(eq=False)
class Backoff:
    """Delays grow by `multiplier` up to `maximum`, each randomized by +-`jitter` (a
    fraction), so a fleet of clients that lost the same server does not reconnect in
    lockstep. `reset()` after a success."""

    initial: float = 0.5
    maximum: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random)
    _next: float = -1.0

    def next_delay(self) -> float:
        if self._next < 0:
            self._next = self.initial
        base = self._next
        self._next = min(self.maximum, self._next * self.multiplier)
        return max(0.0, base * (1 + self.rng.uniform(-self.jitter, self.jitter)))

    def reset(self) -> None:
        self._next = -1.0
