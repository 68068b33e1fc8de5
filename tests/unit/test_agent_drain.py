"""The drain decision without sockets (agent/envoy/drain.py): the drain duration by default;
with EXIT_ON_ZERO_ACTIVE_CONNECTIONS at least the minimum, then until Envoy reports no active
connection (or cannot say); the count read from Envoy's stats text; the env parsing."""

from __future__ import annotations

import pytest

from agent.config import AgentConfigError, build_parser, config_from_args, go_duration
from agent.envoy.drain import DrainPlan, DrainStep, active_connections, drain_step

ON = DrainPlan(duration=30.0, exit_on_zero_active_connections=True, minimum=5.0, poll_interval=0.25)


def test_default_waits_out_the_drain_duration_whatever_the_connections() -> None:
    plan = DrainPlan(duration=5.0)
    assert drain_step(plan, 0.0, None) == DrainStep(False, 5.0)
    assert drain_step(plan, 4.0, 0) == DrainStep(False, 1.0)
    assert drain_step(plan, 5.0, 12).done


def test_exit_on_zero_never_before_the_minimum() -> None:
    assert drain_step(ON, 0.0, 0) == DrainStep(False, 5.0)
    assert drain_step(ON, 4.5, 0) == DrainStep(False, 0.5)
    assert drain_step(ON, 4.5, None) == DrainStep(False, 0.5)


def test_exit_on_zero_after_the_minimum() -> None:
    step = drain_step(ON, 5.0, 3)
    assert step == DrainStep(False, 0.25, "3 active connections")
    # Past the drain duration too: connections still open keep it waiting, as Istio.
    assert not drain_step(ON, 300.0, 1).done
    assert drain_step(ON, 5.0, 0) == DrainStep(True, reason="no active connections left")
    assert drain_step(ON, 6.0, None).done  # Envoy cannot say: stop rather than hang


STATS = """\
http.admin.downstream_cx_active: 1
http.inbound_0.0.0.0_8080.downstream_cx_active: 2
listener.0.0.0.0_15006.downstream_cx_active: 2
listener.0.0.0.0_15006.worker_0.downstream_cx_active: 1
listener.0.0.0.0_15006.worker_1.downstream_cx_active: 1
listener.127.0.1.1_9080.downstream_cx_active: 3
listener.admin.downstream_cx_active: 1
listener.admin.main_thread.downstream_cx_active: 1
not a stat line
listener.x.downstream_cx_active: garbage
"""


def test_active_connections_counts_each_listener_connection_once() -> None:
    assert active_connections(STATS) == 5
    assert active_connections("") == 0
    assert active_connections("listener.admin.downstream_cx_active: 4\n") == 0


def test_env() -> None:
    args = build_parser().parse_args([])
    cfg = config_from_args(args, {})
    assert not cfg.exit_on_zero_active_connections and cfg.minimum_drain_duration == 5.0
    cfg = config_from_args(
        args, {"EXIT_ON_ZERO_ACTIVE_CONNECTIONS": "true", "MINIMUM_DRAIN_DURATION": "1m30s"}
    )
    assert cfg.exit_on_zero_active_connections and cfg.minimum_drain_duration == 90.0
    with pytest.raises(AgentConfigError, match="EXIT_ON_ZERO_ACTIVE_CONNECTIONS: 'yes'"):
        config_from_args(args, {"EXIT_ON_ZERO_ACTIVE_CONNECTIONS": "yes"})
    with pytest.raises(AgentConfigError, match="MINIMUM_DRAIN_DURATION: '5 s' is not a duration"):
        config_from_args(args, {"MINIMUM_DRAIN_DURATION": "5 s"})


@pytest.mark.parametrize(
    ("text", "seconds"), [("5s", 5.0), ("500ms", 0.5), ("1h2m3s", 3723.0), ("2", 2.0), ("0s", 0.0)]
)
def test_go_duration(text: str, seconds: float) -> None:
    assert go_duration(text, "X") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "5x", "-5s", "5s junk"])
def test_bad_go_duration(text: str) -> None:
    with pytest.raises(AgentConfigError):
        go_duration(text, "X")
