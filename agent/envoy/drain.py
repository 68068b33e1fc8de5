"""How long the agent waits for Envoy to drain on SIGTERM, as Istio's agent decides (sans-IO).

By default it waits out the drain duration (`--drain-duration`, Istio's
terminationDrainDuration) and stops Envoy. With `EXIT_ON_ZERO_ACTIVE_CONNECTIONS` it waits at
least `MINIMUM_DRAIN_DURATION` (default 5 s) and then stops as soon as Envoy reports no active
downstream connection, however long that takes (the kubelet's termination grace period is
the bound, as with Istio). A count Envoy cannot give (admin unreachable) ends the wait too:
Istio's agent also terminates then rather than hang.

The count is Istio's: the `downstream_cx_active` gauges of Envoy's listeners, the admin
listener's excluded (our own polling is on it); `listener.*` only and not per worker, since
the HTTP connection managers' and the workers' gauges count the same connections again.
"""

from __future__ import annotations

from dataclasses import dataclass

ACTIVE_CONNECTIONS_PATH = "/stats?usedonly&filter=downstream_cx_active$"
# Istio polls every second; a quicker poll lets the pod go sooner after its last connection.
POLL_INTERVAL = 0.25


@dataclass(frozen=True, slots=True, eq=False)
class DrainPlan:
    """How long a drain lasts and when it may end early."""

    duration: float = 5.0
    exit_on_zero_active_connections: bool = False
    minimum: float = 5.0
    poll_interval: float = POLL_INTERVAL


@dataclass(frozen=True, slots=True)
class DrainStep:
    """One decision of a drain: done, or wait this long and ask again."""

    done: bool
    wait: float = 0.0  # seconds until the next decision, when not done
    reason: str = ""


def drain_step(plan: DrainPlan, elapsed: float, active: int | None) -> DrainStep:
    """`elapsed`: seconds since the drain began; `active`: Envoy's active downstream
    connections just now (None: Envoy could not say). Ignored before the minimum and without
    exit-on-zero."""
    if not plan.exit_on_zero_active_connections:
        if elapsed >= plan.duration:
            return DrainStep(True, reason=f"drain duration {plan.duration:g}s is over")
        return DrainStep(False, plan.duration - elapsed)
    if elapsed < plan.minimum:
        return DrainStep(False, plan.minimum - elapsed)
    if active is None:
        return DrainStep(True, reason="Envoy's active connections are not available")
    if active <= 0:
        return DrainStep(True, reason="no active connections left")
    return DrainStep(False, plan.poll_interval, reason=f"{active} active connections")


def active_connections(stats: str) -> int:
    """The sum of the listeners' `downstream_cx_active` in Envoy's /stats text."""
    total = 0
    for line in stats.splitlines():
        name, sep, value = line.partition(":")
        name = name.strip()
        if not sep or not name.startswith("listener.") or name.startswith("listener.admin."):
            continue
        if not name.endswith(".downstream_cx_active") or ".worker_" in name:
            continue  # per-worker gauges repeat the listener's
        value = value.strip()
        if value.isdigit():
            total += int(value)
    return total
