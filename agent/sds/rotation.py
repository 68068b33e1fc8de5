"""When to ask for the next workload certificate, sans-IO.

A certificate is refreshed when `ratio` (half) of its lifetime has passed, moved by a random
`jitter` (a fraction of the lifetime) so that a fleet of agents started together does not
hit the CA in lockstep. A failed attempt is retried after a jittered exponential backoff,
capped so that a certificate still in force is retried well before it expires. Times are
wall-clock seconds (certificates carry wall-clock validity); `now` is always passed in and
the random source is injected, so schedules are exact in tests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from pilotfish_common.backoff import Backoff


@dataclass(frozen=True, slots=True, eq=False)
class RotationPolicy:
    """When certificates are renewed and failed attempts retried."""

    ratio: float = 0.5
    jitter: float = 0.05
    # Never ask again sooner than this after a success: a CA that returns certificates
    # already past their refresh point must not make the agent spin.
    min_delay: float = 1.0
    retry_initial: float = 1.0
    retry_max: float = 60.0
    retry_multiplier: float = 2.0
    retry_jitter: float = 0.2

    def __post_init__(self) -> None:
        if not 0.0 < self.ratio < 1.0:
            raise ValueError(f"rotation ratio must be in (0, 1), got {self.ratio}")
        if not 0.0 <= self.jitter < min(self.ratio, 1.0 - self.ratio):
            raise ValueError(f"rotation jitter {self.jitter} does not fit ratio {self.ratio}")
        if self.min_delay < 0 or self.retry_initial <= 0 or self.retry_max < self.retry_initial:
            raise ValueError("rotation delays must be positive and retry_max >= retry_initial")


def refresh_at(
    not_before: float, not_after: float, rng: random.Random, policy: RotationPolicy
) -> float:
    """The wall-clock time at which a certificate valid [not_before, not_after] is renewed."""
    lifetime = max(0.0, not_after - not_before)
    fraction = policy.ratio + rng.uniform(-policy.jitter, policy.jitter)
    return not_before + lifetime * fraction


class RotationSchedule:
    """Delays between signing attempts. Drive it from one task: `after_success` when a
    certificate was installed, `after_failure` when an attempt failed."""

    def __init__(self, policy: RotationPolicy | None = None, rng: random.Random | None = None):
        self.policy = policy or RotationPolicy()
        self._rng = rng or random.Random()
        self._backoff = Backoff(
            initial=self.policy.retry_initial,
            maximum=self.policy.retry_max,
            multiplier=self.policy.retry_multiplier,
            jitter=self.policy.retry_jitter,
            rng=self._rng,
        )
        self.failures = 0  # consecutive

    def after_success(self, not_before: float, not_after: float, now: float) -> float:
        """Seconds from `now` until the certificate just installed should be renewed."""
        self._backoff.reset()
        self.failures = 0
        at = refresh_at(not_before, not_after, self._rng, self.policy)
        return max(self.policy.min_delay, at - now)

    def after_failure(
        self, now: float, not_after: float | None = None, *, retryable: bool = True
    ) -> float:
        """Seconds from `now` until the next attempt after a failure. `not_after` is the expiry
        of the certificate still being served (None: there is none)."""
        self.failures += 1
        delay = self._backoff.next_delay()
        if not retryable:
            # Retrying quickly cannot help; keep trying slowly so a fixed token or policy is
            # picked up without a restart.
            delay = max(delay, self.policy.retry_max)
        if not_after is not None and now < not_after:
            # Half of the remaining validity at most (but never faster than the first retry),
            # so several attempts fit before the served certificate expires.
            delay = min(delay, max(self.policy.retry_initial, (not_after - now) / 2))
        return delay
