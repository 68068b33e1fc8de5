"""When to probe and when health changes, as Kubernetes' prober decides (sans-IO).

Probes start `initial_delay` after the probe is known, then every `period` (measured from
the start of one probe to the start of the next; a probe that overruns delays the next, it
never overlaps it). Health becomes healthy after `success_threshold` consecutive successes
and unhealthy after `failure_threshold` consecutive failures; until either, it is unknown
(None), which the control plane treats as not serving. Only changes are decisions: the
adapter reports each one, and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Schedule:
    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3


@dataclass(frozen=True, slots=True)
class Health:
    healthy: bool
    reason: str = ""  # why not healthy: the last failed probe's error


class Prober:
    """Feed it `now` and results; it says when to probe next and when health changed."""

    def __init__(self, schedule: Schedule, now: float) -> None:
        self.schedule = schedule
        self._next = now + max(0.0, schedule.initial_delay)
        self._probing = False
        self._successes = 0
        self._failures = 0
        self.health: Health | None = None

    def next_probe_at(self) -> float | None:
        """When the next probe is due; None while one is running."""
        return None if self._probing else self._next

    def due(self, now: float) -> bool:
        return not self._probing and now >= self._next

    def started(self, now: float) -> None:
        """A probe starts now (the adapter bounds it by `schedule.timeout`)."""
        self._probing = True
        self._next = now + max(self.schedule.period, 0.001)

    def finished(self, now: float, error: str | None) -> Health | None:
        """The running probe ended (`error` None: success). Returns the new health when it
        changed, else None. A probe that overran its period leaves the next one due now."""
        self._probing = False
        if error is None:
            self._successes += 1
            self._failures = 0
            if self._successes >= max(1, self.schedule.success_threshold):
                return self._become(Health(True))
        else:
            self._failures += 1
            self._successes = 0
            if self._failures >= max(1, self.schedule.failure_threshold):
                return self._become(Health(False, error))
        return None

    def _become(self, health: Health) -> Health | None:
        if self.health is not None and self.health.healthy == health.healthy:
            self.health = health  # the newest reason, but no change to report
            return None
        self.health = health
        return health
