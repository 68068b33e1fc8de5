"""How long to wait after a 409 Conflict before reading again, sans-IO; shared by the writers
of API objects that several replicas update at once (the webhook caBundle patcher, the root
certificate publisher)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class ConflictRetry:
    """Delays after successive conflicts: `fast` quick ones, then slow ones; jittered so that
    racing replicas do not retry in lockstep."""

    fast: int = 4
    fast_delay: float = 0.05
    slow_delay: float = 5.0
    jitter: float = 0.5
    rng: random.Random = field(default_factory=random.Random)
    conflicts: int = 0

    def next_delay(self) -> float:
        self.conflicts += 1
        base = self.fast_delay if self.conflicts <= self.fast else self.slow_delay
        return base * (1 + self.rng.uniform(-self.jitter, self.jitter))

    def reset(self) -> None:
        self.conflicts = 0
