"""Health-gated registration (issue 18): what a health report changes in the registry
(control/registry/autoregister.py), sans-IO."""

from __future__ import annotations

import dataclasses

from control.ca.identity import Identity
from control.model.workloadgroup import WorkloadGroup, WorkloadProbe
from control.registry.autoregister import HEALTH_CHECK_ANNOTATION, WorkloadRegistry
from tests.unit.test_registry import WEB, group, proxy

HTTP_PROBE = WorkloadProbe("httpGet", port=8080, path="/ready")


def probed(probe: WorkloadProbe | None = HTTP_PROBE) -> WorkloadGroup:
    return dataclasses.replace(group(), probe=probe)


def joined(g: WorkloadGroup | None = None) -> WorkloadRegistry:
    reg = WorkloadRegistry(grace=10.0)
    reg.set_groups((g or probed(),))
    reg.connect(proxy(), WEB)
    return reg


def addresses(reg: WorkloadRegistry) -> list[str]:
    return [w.address for w in reg.workloads()]


def test_a_member_of_a_probed_group_serves_only_after_its_first_healthy_report() -> None:
    reg = joined()
    assert addresses(reg) == []  # Istio: condition unset counts as not healthy
    (entry,) = reg.workload_entries()
    assert entry["metadata"]["annotations"][HEALTH_CHECK_ANNOTATION] == "true"
    assert entry["status"]["serving"] is False and "conditions" not in entry["status"]
    v = reg.version
    assert reg.report_health(proxy(), WEB, None, 1000.0)
    assert addresses(reg) == ["10.0.0.1"] and reg.version == v + 1
    (entry,) = reg.workload_entries()
    (cond,) = entry["status"]["conditions"]
    assert (cond["type"], cond["status"]) == ("Healthy", "True")


def test_unhealthy_leaves_and_healthy_returns() -> None:
    reg = joined()
    reg.report_health(proxy(), WEB, None, 1.0)
    assert reg.report_health(proxy(), WEB, "HTTP GET: status 500", 2.0)
    assert addresses(reg) == []
    (entry,) = reg.workload_entries()
    (cond,) = entry["status"]["conditions"]
    assert cond["status"] == "False" and cond["message"] == "HTTP GET: status 500"
    # The same health again changes nothing that serves.
    assert not reg.report_health(proxy(), WEB, "HTTP GET: status 503", 3.0)
    assert reg.report_health(proxy(), WEB, None, 4.0)
    assert addresses(reg) == ["10.0.0.1"]


def test_a_group_without_a_probe_does_not_gate_and_ignores_reports() -> None:
    reg = joined(probed(None))
    assert addresses(reg) == ["10.0.0.1"]
    assert not reg.report_health(proxy(), WEB, "down", 1.0)
    assert addresses(reg) == ["10.0.0.1"]
    assert HEALTH_CHECK_ANNOTATION not in reg.workload_entries()[0]["metadata"]["annotations"]


def test_exec_probes_gate_nothing_but_grpc_probes_do() -> None:
    reg = joined(probed(WorkloadProbe("exec", command=("true",))))
    assert addresses(reg) == ["10.0.0.1"]
    assert not reg.report_health(proxy(), WEB, "down", 1.0)
    reg = joined(probed(WorkloadProbe("grpc", port=50051)))
    assert addresses(reg) == []
    assert reg.report_health(proxy(), WEB, None, 1.0)


def test_reports_from_another_identity_or_the_plaintext_port_change_nothing() -> None:
    reg = joined()
    mallory = Identity("shop", "mallory")
    # Mallory's stream for the very same node (ip, pod): an entry of its own, refused.
    reg.connect(proxy(), mallory)
    assert not reg.report_health(proxy(), mallory, None, 1.0)
    assert not reg.report_health(proxy(), None, None, 1.0)
    assert addresses(reg) == []
    reg.report_health(proxy(), WEB, None, 2.0)
    assert not reg.report_health(proxy(), mallory, "down", 3.0)
    assert not reg.report_health(proxy(), None, "down", 3.0)
    assert addresses(reg) == ["10.0.0.1"]


def test_a_report_after_the_last_stream_closed_is_ignored() -> None:
    reg = joined()
    reg.disconnect(proxy(), WEB, now=5.0)
    assert not reg.report_health(proxy(), WEB, None, 6.0)
    assert addresses(reg) == []


def test_gaining_a_probe_gates_existing_members_until_they_report() -> None:
    reg = joined(probed(None))
    assert addresses(reg) == ["10.0.0.1"]
    reg.set_groups((probed(),))
    assert addresses(reg) == []
    assert reg.report_health(proxy(), WEB, None, 1.0)
    reg.set_groups((probed(None),))
    assert addresses(reg) == ["10.0.0.1"]


def test_health_survives_a_snapshot_and_restore() -> None:
    reg = joined()
    reg.report_health(proxy(), WEB, None, 1.0)
    saved = reg.snapshot()
    assert saved[0]["healthy"] is True
    restored = WorkloadRegistry(grace=10.0)
    assert restored.restore(saved, now=0.0) == 1
    restored.set_groups((probed(),))
    assert addresses(restored) == ["10.0.0.1"]
    # Never reported: restored as never reported (out of EDS until the agent says so).
    fresh = joined()
    again = WorkloadRegistry(grace=10.0)
    again.restore(fresh.snapshot(), now=0.0)
    again.set_groups((probed(),))
    assert addresses(again) == []
