"""Rotation schedule (agent/sds/rotation.py): pure functions of times and a seeded random."""

from __future__ import annotations

import random

import pytest

from agent.sds.rotation import RotationPolicy, RotationSchedule, refresh_at

T0 = 1_700_000_000.0
DAY = 86400.0


class Fixed(random.Random):
    """A random source whose uniform() returns a chosen point of the interval (0..1)."""

    def __init__(self, at: float) -> None:
        super().__init__(0)
        self.at = at

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self.at


def test_refresh_at_half_the_lifetime_without_jitter() -> None:
    policy = RotationPolicy(jitter=0.0)
    assert refresh_at(T0, T0 + DAY, random.Random(1), policy) == T0 + DAY / 2


@pytest.mark.parametrize(("point", "fraction"), [(0.0, 0.45), (0.5, 0.5), (1.0, 0.55)])
def test_jitter_moves_the_refresh_within_the_band(point: float, fraction: float) -> None:
    policy = RotationPolicy(ratio=0.5, jitter=0.05)
    assert refresh_at(T0, T0 + DAY, Fixed(point), policy) == pytest.approx(T0 + DAY * fraction)


def test_jitter_spreads_a_fleet() -> None:
    policy = RotationPolicy()
    rng = random.Random(42)
    times = [refresh_at(T0, T0 + DAY, rng, policy) for _ in range(200)]
    assert all(T0 + 0.45 * DAY <= t <= T0 + 0.55 * DAY for t in times)
    assert len({round(t) for t in times}) > 150  # not in lockstep


def test_same_seed_same_schedule() -> None:
    a = RotationSchedule(rng=random.Random(7))
    b = RotationSchedule(rng=random.Random(7))
    assert a.after_success(T0, T0 + DAY, T0) == b.after_success(T0, T0 + DAY, T0)


def test_after_success_is_measured_from_now() -> None:
    s = RotationSchedule(RotationPolicy(jitter=0.0), random.Random(0))
    # Issued a minute ago (CA clock, or the attempt took time): the delay counts from now.
    assert s.after_success(T0 - 60, T0 - 60 + 3600, T0) == 1800 - 60


def test_after_success_never_spins() -> None:
    s = RotationSchedule(RotationPolicy(jitter=0.0, min_delay=2.0), random.Random(0))
    # A certificate already past its refresh point (a CA that caps lifetimes very short).
    assert s.after_success(T0 - 100, T0 + 10, T0) == 2.0


def test_failures_back_off_exponentially_with_jitter_and_reset_on_success() -> None:
    policy = RotationPolicy(retry_initial=1.0, retry_max=16.0, retry_jitter=0.0)
    s = RotationSchedule(policy, random.Random(0))
    assert [s.after_failure(T0) for _ in range(7)] == [1, 2, 4, 8, 16, 16, 16]
    assert s.failures == 7
    s.after_success(T0, T0 + DAY, T0)
    assert s.failures == 0
    assert s.after_failure(T0) == 1


def test_retry_jitter_band() -> None:
    policy = RotationPolicy(retry_initial=10.0, retry_max=100.0, retry_jitter=0.2)
    delays = [RotationSchedule(policy, random.Random(i)).after_failure(T0) for i in range(100)]
    assert all(8.0 <= d <= 12.0 for d in delays)
    assert len(set(delays)) > 50


def test_retries_fit_before_the_served_certificate_expires() -> None:
    policy = RotationPolicy(retry_initial=1.0, retry_max=600.0, retry_jitter=0.0)
    s = RotationSchedule(policy, random.Random(0))
    for _ in range(8):
        s.after_failure(T0)  # backoff has grown to 128 s and beyond
    # 40 s of validity left: retry within half of it.
    assert s.after_failure(T0, not_after=T0 + 40) == 20
    # Almost expired: never faster than the first retry delay.
    assert s.after_failure(T0, not_after=T0 + 0.5) == 1.0
    # Expired: plain backoff.
    assert s.after_failure(T0, not_after=T0 - 1) == 600


def test_non_retryable_failure_waits_the_slowest_pace() -> None:
    policy = RotationPolicy(retry_initial=1.0, retry_max=60.0, retry_jitter=0.0)
    s = RotationSchedule(policy, random.Random(0))
    assert s.after_failure(T0, retryable=False) == 60
    # ... unless the served certificate would expire first.
    assert s.after_failure(T0, not_after=T0 + 30, retryable=False) == 15


@pytest.mark.parametrize(
    "kwargs",
    [{"ratio": 0.0}, {"ratio": 1.0}, {"ratio": 0.5, "jitter": 0.5}, {"retry_max": 0.5}],
)
def test_policy_validation(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RotationPolicy(**kwargs)
