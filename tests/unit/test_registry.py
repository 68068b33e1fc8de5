"""Workload auto-registration decisions and bookkeeping (control/registry/autoregister.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from control.ca.identity import Identity
from control.model.proxy import Proxy, proxy_from_node
from control.model.types import SourceRef
from control.model.workloadgroup import WorkloadGroup
from control.registry.autoregister import (
    Refusal,
    Refused,
    WorkloadRegistry,
    decide,
    entry_name,
)

WEB = Identity("shop", "web")


def group(
    name: str = "web",
    ns: str = "shop",
    sa: str = "web",
    labels: dict[str, str] | None = None,
    ports: tuple[tuple[str, int], ...] = (("http", 8080),),
) -> WorkloadGroup:
    return WorkloadGroup(
        namespace=ns,
        name=name,
        source=SourceRef("WorkloadGroup", ns, name, "groups.yaml", 1),
        labels=tuple(sorted((labels if labels is not None else {"app": "web"}).items())),
        service_account=sa,
        ports=ports,
    )


def proxy(
    ip: str = "10.0.0.1", pod: str = "web-1", ns: str = "shop", wg: str = "web", **meta: Any
) -> Proxy:
    metadata: dict[str, Any] = {"LABELS": {"app": "web"}, "SDS": "true", **meta}
    if wg:
        metadata["WORKLOAD_GROUP"] = wg
    return proxy_from_node(f"sidecar~{ip}~{pod}.{ns}~{ns}.svc.cluster.local", metadata)


def registry(grace: float = 10.0, *groups: WorkloadGroup) -> WorkloadRegistry:
    reg = WorkloadRegistry(grace=grace)
    reg.set_groups(groups or (group(),))
    return reg


# --- decisions ------------------------------------------------------------------------------


def test_decide_admits_the_groups_identity_with_the_groups_template() -> None:
    p = proxy(LABELS={"app": "evil", "version": "v2"}, SERVICE_ACCOUNT="mallory")
    wl = decide(p, WEB, group())
    assert not isinstance(wl, Refused)
    assert (wl.name, wl.namespace, wl.address) == ("web-1", "shop", "10.0.0.1")
    # The group's keys win; the proxy adds only keys the group does not set.
    assert dict(wl.labels) == {"app": "web", "version": "v2"}
    assert wl.service_account == "web"  # the group's, not the node's claim
    assert wl.ports == (("http", 8080),) and wl.has_sidecar


def test_decide_refuses_unauthenticated_streams() -> None:
    verdict = decide(proxy(), None, group())
    assert isinstance(verdict, Refused) and verdict.reason is Refusal.UNAUTHENTICATED


def test_decide_refuses_another_service_account() -> None:
    verdict = decide(proxy(), Identity("shop", "mallory"), group())
    assert isinstance(verdict, Refused) and verdict.reason is Refusal.IDENTITY
    assert "shop/mallory" in verdict.message and "shop/web" in verdict.message


def test_decide_refuses_another_namespace() -> None:
    verdict = decide(proxy(), Identity("other", "web"), group())
    assert isinstance(verdict, Refused) and verdict.reason is Refusal.IDENTITY


def test_decide_refuses_a_missing_group() -> None:
    verdict = decide(proxy(), WEB, None)
    assert isinstance(verdict, Refused) and verdict.reason is Refusal.NO_GROUP


def test_workload_group_from_istio_metadata_name() -> None:
    p = proxy(wg="", AUTO_REGISTER_GROUP="web")
    assert p.workload_group == "web"
    reg = registry()
    assert reg.connect(p, WEB) is True


# --- bookkeeping ----------------------------------------------------------------------------


def test_connect_registers_workload() -> None:
    reg = registry()
    assert reg.connect(proxy(), WEB) is True
    (wl,) = reg.workloads()
    assert (wl.name, wl.namespace, wl.address) == ("web-1", "shop", "10.0.0.1")
    assert dict(wl.labels) == {"app": "web"}
    assert reg.version == 1


def test_proxy_without_group_is_not_registered_nor_tracked() -> None:
    reg = registry()
    p = proxy(wg="")
    assert reg.connect(p, WEB) is False
    assert reg.workloads() == () and reg.version == 0
    reg.disconnect(p, WEB, now=0.0)
    assert reg.next_expiry() is None


def test_refusal_is_logged_once_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    counted: list[Refusal] = []
    reg = WorkloadRegistry(on_refused=counted.append)
    reg.set_groups([group()])
    p = proxy()
    with caplog.at_level(logging.WARNING, "control.registry.autoregister"):
        assert reg.connect(p, None) is False
        assert reg.connect(p, None) is False  # a second stream of the same proxy
    assert reg.workloads() == ()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and p.id in warnings[0] and "unauthenticated" in warnings[0]
    assert counted == [Refusal.UNAUTHENTICATED]
    reg.disconnect(p, None, now=0.0)
    reg.disconnect(p, None, now=0.0)
    assert reg.next_expiry() is None  # nothing kept for a refused proxy


def test_second_stream_of_same_proxy_changes_nothing() -> None:
    reg = registry()
    p = proxy()
    reg.connect(p, WEB)
    assert reg.connect(p, WEB) is False
    assert len(reg.workloads()) == 1 and reg.version == 1


def test_unauthenticated_stream_with_a_registered_proxys_id_changes_nothing() -> None:
    reg = registry(1.0)
    p = proxy()
    reg.connect(p, WEB)
    assert reg.connect(proxy(LABELS={"app": "other"}), None) is False
    (wl,) = reg.workloads()
    assert dict(wl.labels) == {"app": "web"}
    reg.disconnect(p, WEB, now=0.0)
    assert reg.expire(1.0) != []  # the impostor's open stream does not keep it alive


def test_disconnect_keeps_workload_until_grace_expires() -> None:
    reg = registry(10.0)
    p = proxy()
    reg.connect(p, WEB)
    reg.disconnect(p, WEB, now=100.0)
    assert len(reg.workloads()) == 1
    assert reg.next_expiry() == 110.0
    assert reg.expire(109.9) == []
    (gone,) = reg.expire(110.0)
    assert gone.address == "10.0.0.1"
    assert reg.workloads() == () and reg.next_expiry() is None
    assert reg.version == 2


def test_reconnect_within_grace_keeps_workload() -> None:
    reg = registry(10.0)
    p = proxy()
    reg.connect(p, WEB)
    reg.disconnect(p, WEB, now=100.0)
    assert reg.connect(p, WEB) is False
    assert reg.next_expiry() is None
    assert reg.expire(1000.0) == []
    assert len(reg.workloads()) == 1 and reg.version == 1


def test_workload_stays_while_any_stream_is_open() -> None:
    reg = registry(1.0)
    p = proxy()
    reg.connect(p, WEB)
    reg.connect(p, WEB)
    reg.disconnect(p, WEB, now=0.0)
    assert reg.next_expiry() is None
    reg.disconnect(p, WEB, now=100.0)
    assert reg.expire(101.0) != []


def test_changed_proxy_labels_add_keys_only() -> None:
    reg = registry()
    reg.connect(proxy(), WEB)
    assert reg.connect(proxy(LABELS={"app": "x", "version": "v2"}), WEB) is True
    (wl,) = reg.workloads()
    assert dict(wl.labels) == {"app": "web", "version": "v2"}


def test_auto_register_false_is_ignored() -> None:
    reg = registry()
    p = proxy(AUTO_REGISTER="false")
    assert reg.connect(p, WEB) is False
    reg.disconnect(p, WEB, now=0.0)
    assert reg.workloads() == () and reg.version == 0


def test_disconnect_of_unknown_proxy_is_harmless() -> None:
    reg = registry()
    reg.disconnect(proxy(), WEB, now=0.0)
    assert reg.workloads() == () and reg.expire(100.0) == []


def test_several_proxies_expire_independently_and_sorted() -> None:
    reg = registry(5.0)
    a, b = proxy("10.0.0.2", "b-1"), proxy("10.0.0.1", "a-1")
    reg.connect(a, WEB)
    reg.connect(b, WEB)
    assert [w.address for w in reg.workloads()] == ["10.0.0.1", "10.0.0.2"]
    reg.disconnect(a, WEB, now=0.0)
    reg.disconnect(b, WEB, now=3.0)
    assert reg.next_expiry() == 5.0
    assert [w.name for w in reg.expire(5.0)] == ["b-1"]
    assert [w.name for w in reg.expire(8.0)] == ["a-1"]


# --- config changes -------------------------------------------------------------------------


def test_deleted_group_removes_its_workloads() -> None:
    reg = registry()
    reg.connect(proxy(), WEB)
    assert reg.set_groups([]) is True
    assert reg.workloads() == ()
    assert reg.set_groups([group()]) is True  # the proxy is still connected: back again
    assert len(reg.workloads()) == 1


def test_changed_template_updates_workloads() -> None:
    reg = registry()
    reg.connect(proxy(), WEB)
    assert reg.set_groups([group(labels={"app": "web", "track": "canary"}, ports=())]) is True
    (wl,) = reg.workloads()
    assert dict(wl.labels) == {"app": "web", "track": "canary"} and wl.ports == ()
    assert reg.set_groups([group(labels={"app": "web", "track": "canary"}, ports=())]) is False


def test_changed_service_account_removes_workloads() -> None:
    reg = registry()
    reg.connect(proxy(), WEB)
    assert reg.set_groups([group(sa="payments")]) is True
    assert reg.workloads() == ()


def test_group_created_after_connect_admits_the_proxy() -> None:
    reg = WorkloadRegistry()
    p = proxy()
    assert reg.connect(p, WEB) is False
    assert reg.set_groups([group()]) is True
    assert len(reg.workloads()) == 1


def test_workload_entries_name_their_group() -> None:
    reg = registry()
    reg.connect(proxy(), WEB)
    (entry,) = reg.workload_entries()
    assert entry["kind"] == "WorkloadEntry"
    assert entry["metadata"]["name"] == entry_name("web", "10.0.0.1") == "web-10.0.0.1"
    assert entry["metadata"]["annotations"]["istio.io/autoRegistrationGroup"] == "web"
    assert entry["spec"]["address"] == "10.0.0.1" and entry["spec"]["serviceAccount"] == "web"
    assert entry["status"]["identity"] == "shop/web" and entry["status"]["connected"]


# --- persistence ----------------------------------------------------------------------------


def test_snapshot_and_restore_round_trip() -> None:
    reg = registry(10.0)
    reg.connect(proxy(), WEB)
    snap = reg.snapshot()
    fresh = WorkloadRegistry(grace=10.0)
    assert fresh.restore(snap, now=50.0) == 1
    assert fresh.workloads() == ()  # undecided until the groups are known
    assert fresh.set_groups([group()]) is True
    assert fresh.workloads() == reg.workloads()
    assert fresh.next_expiry() == 60.0


def test_restored_entry_is_decided_against_the_new_config() -> None:
    reg = registry()
    reg.connect(proxy(), WEB)
    snap = reg.snapshot()
    fresh = WorkloadRegistry()
    fresh.restore(snap, now=0.0)
    assert fresh.set_groups([group(sa="payments")]) is False
    assert fresh.workloads() == () and fresh.next_expiry() is None


def test_restore_skips_entries_without_group_or_identity() -> None:
    # The format before groups: what a proxy claimed, with nothing that proves it.
    old = {
        "proxy": "sidecar~10.0.0.9~evil.shop~shop.svc.cluster.local",
        "name": "evil",
        "namespace": "shop",
        "address": "10.0.0.9",
        "labels": {"app": "web"},
        "service_account": "mallory",
    }
    forged = dict(old, group="web", pod="evil", identity={"namespace": "shop"})
    fresh = WorkloadRegistry()
    assert fresh.restore([old, forged, {"nonsense": 1}], now=0.0) == 0
    fresh.set_groups([group()])
    assert fresh.workloads() == ()
