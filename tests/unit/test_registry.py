"""Workload auto-registration bookkeeping (control/registry/autoregister.py)."""

from __future__ import annotations

from typing import Any

from control.model.proxy import Proxy, proxy_from_node
from control.registry.autoregister import WorkloadRegistry


def proxy(ip: str = "10.0.0.1", pod: str = "web-1", ns: str = "shop", **meta: Any) -> Proxy:
    metadata: dict[str, Any] = {"LABELS": {"app": "web"}, **meta}
    return proxy_from_node(f"sidecar~{ip}~{pod}.{ns}~{ns}.svc.cluster.local", metadata)


def test_connect_registers_workload() -> None:
    reg = WorkloadRegistry(grace=10.0)
    p = proxy()
    assert reg.connect(p) is True
    (wl,) = reg.workloads()
    assert (wl.name, wl.namespace, wl.address) == ("web-1", "shop", "10.0.0.1")
    assert dict(wl.labels) == {"app": "web"}
    assert reg.version == 1


def test_second_stream_of_same_proxy_changes_nothing() -> None:
    reg = WorkloadRegistry()
    p = proxy()
    reg.connect(p)
    assert reg.connect(p) is False
    assert len(reg.workloads()) == 1 and reg.version == 1


def test_disconnect_keeps_workload_until_grace_expires() -> None:
    reg = WorkloadRegistry(grace=10.0)
    p = proxy()
    reg.connect(p)
    reg.disconnect(p, now=100.0)
    assert len(reg.workloads()) == 1
    assert reg.next_expiry() == 110.0
    assert reg.expire(109.9) == []
    assert len(reg.workloads()) == 1
    (gone,) = reg.expire(110.0)
    assert gone.address == "10.0.0.1"
    assert reg.workloads() == () and reg.next_expiry() is None
    assert reg.version == 2


def test_reconnect_within_grace_keeps_workload() -> None:
    reg = WorkloadRegistry(grace=10.0)
    p = proxy()
    reg.connect(p)
    reg.disconnect(p, now=100.0)
    assert reg.connect(p) is False  # same workload: no change, no push
    assert reg.next_expiry() is None
    assert reg.expire(1000.0) == []
    assert len(reg.workloads()) == 1 and reg.version == 1


def test_workload_stays_while_any_stream_is_open() -> None:
    reg = WorkloadRegistry(grace=1.0)
    p = proxy()
    reg.connect(p)
    reg.connect(p)  # e.g. a second ADS stream during a control-plane handover
    reg.disconnect(p, now=0.0)
    assert reg.next_expiry() is None
    assert reg.expire(100.0) == []
    reg.disconnect(p, now=100.0)
    assert reg.expire(101.0) != []


def test_changed_metadata_updates_workload() -> None:
    reg = WorkloadRegistry()
    reg.connect(proxy())
    relabelled = proxy(LABELS={"app": "web", "version": "v2"})
    assert reg.connect(relabelled) is True
    (wl,) = reg.workloads()
    assert dict(wl.labels) == {"app": "web", "version": "v2"}
    assert reg.version == 2


def test_auto_register_false_is_ignored() -> None:
    reg = WorkloadRegistry()
    p = proxy(AUTO_REGISTER="false")
    assert reg.connect(p) is False
    reg.disconnect(p, now=0.0)
    assert reg.workloads() == () and reg.version == 0


def test_disconnect_of_unknown_proxy_is_harmless() -> None:
    reg = WorkloadRegistry()
    reg.disconnect(proxy(), now=0.0)
    assert reg.workloads() == () and reg.expire(100.0) == []


def test_several_proxies_expire_independently_and_sorted() -> None:
    reg = WorkloadRegistry(grace=5.0)
    a, b = proxy("10.0.0.2", "b-1"), proxy("10.0.0.1", "a-1")
    reg.connect(a)
    reg.connect(b)
    assert [w.address for w in reg.workloads()] == ["10.0.0.1", "10.0.0.2"]
    reg.disconnect(a, now=0.0)
    reg.disconnect(b, now=3.0)
    assert reg.next_expiry() == 5.0
    assert [w.name for w in reg.expire(5.0)] == ["b-1"]
    assert reg.next_expiry() == 8.0
    assert [w.name for w in reg.expire(8.0)] == ["a-1"]
