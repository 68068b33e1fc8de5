"""The probe schedule and thresholds (agent/health/prober.py), and the checker's handling of
probe resources with a fake check and clock (agent/health/checker.py): no sockets."""

from __future__ import annotations

import asyncio

import pytest

from agent.health.checker import HealthChecker, ProbeSpec, spec_of
from agent.health.prober import Health, Prober, Schedule
from agent.xdsproxy.handlers import HandlerError
from protos import probe_pb2


def run(prober: Prober, now: float, error: str | None) -> Health | None:
    assert prober.due(now)
    prober.started(now)
    return prober.finished(now, error)


def test_first_probe_waits_for_the_initial_delay_then_runs_every_period() -> None:
    p = Prober(Schedule(initial_delay=5, period=2), now=100.0)
    assert p.next_probe_at() == 105.0 and not p.due(104.9)
    p.started(105.0)
    assert p.next_probe_at() is None and not p.due(200.0)  # never two at once
    p.finished(105.5, None)
    assert p.next_probe_at() == 107.0  # from the start of the last probe


def test_an_overrunning_probe_leaves_the_next_one_due_at_once() -> None:
    p = Prober(Schedule(period=1), now=0.0)
    p.started(0.0)
    p.finished(3.0, None)
    assert p.due(3.0)


def test_success_threshold_then_failure_threshold() -> None:
    p = Prober(Schedule(period=1, success_threshold=2, failure_threshold=3), now=0.0)
    assert run(p, 0, None) is None and p.health is None
    assert run(p, 1, None) == Health(True)
    assert run(p, 2, None) is None  # no change, nothing to report
    assert run(p, 3, "status 500") is None
    assert run(p, 4, "status 500") is None
    assert run(p, 5, "status 503") == Health(False, "status 503")
    assert run(p, 6, "refused") is None  # still unhealthy
    assert p.health == Health(False, "refused")
    assert run(p, 7, None) is None  # one success short of the threshold
    assert run(p, 8, None) == Health(True)


def test_a_success_resets_the_failure_count() -> None:
    p = Prober(Schedule(failure_threshold=2), now=0.0)
    run(p, 0, None)
    assert run(p, 10, "x") is None
    assert run(p, 20, None) is None
    assert run(p, 30, "x") is None
    assert run(p, 40, "x") == Health(False, "x")


def test_first_result_failing_reports_unhealthy_after_the_threshold() -> None:
    p = Prober(Schedule(failure_threshold=1), now=0.0)
    assert run(p, 0, "refused") == Health(False, "refused")


def test_spec_of_fills_kubernetes_defaults_and_the_workload_address() -> None:
    msg = probe_pb2.WorkloadProbe(http_get=probe_pb2.HttpGet(port=8080, headers={"x": "1"}))
    spec = spec_of(msg, "10.1.2.3")
    assert spec == ProbeSpec(
        "http_get",
        "10.1.2.3",
        8080,
        Schedule(period=10, timeout=1, success_threshold=1, failure_threshold=3),
        path="/",
        headers=(("x", "1"),),
    )
    tcp = probe_pb2.WorkloadProbe(tcp_socket=probe_pb2.TcpSocket(host="db", port=5432))
    assert (spec_of(tcp, "10.1.2.3").host, spec_of(tcp, "x").port) == ("db", 5432)


async def test_checker_runs_the_probe_it_is_sent_and_reports_changes() -> None:
    results = ["down", None, None, "down"]
    reports: list[Health] = []
    specs: list[ProbeSpec] = []

    async def check(spec: ProbeSpec) -> str | None:
        specs.append(spec)
        return results.pop(0) if results else None

    checker = HealthChecker("10.0.0.5", reports.append, check=check)
    msg = probe_pb2.WorkloadProbe(
        period_seconds=1, failure_threshold=1, tcp_socket=probe_pb2.TcpSocket(port=9)
    )
    async with checker:
        # Time is the loop's: a 1 s period would make this slow, so shrink it.
        await checker([msg])
        assert checker.spec is not None and checker.spec.host == "10.0.0.5"
        async with asyncio.timeout(30):
            while len(reports) < 2:
                await asyncio.sleep(0.05)
        assert reports[:2] == [Health(False, "down"), Health(True)]
        await checker([])  # no probe: stop
        assert checker.spec is None
        n = len(specs)
        await asyncio.sleep(1.5)
        assert len(specs) == n


async def test_checker_does_not_run_exec_and_rejects_several_probes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def check(spec: ProbeSpec) -> str | None:
        raise AssertionError("must not run")

    checker = HealthChecker("10.0.0.5", lambda h: None, check=check)
    async with checker:
        await checker([probe_pb2.WorkloadProbe(exec=probe_pb2.Exec(command=["true"]))])
        assert "exec probes are not run" in caplog.text
        with pytest.raises(HandlerError):
            await checker([probe_pb2.WorkloadProbe(), probe_pb2.WorkloadProbe()])
