"""The list+watch state machine without sockets, and pods as workloads."""

from __future__ import annotations

import random

import pytest

from control.kube.reflector import Backoff, Next, Reflector, WatchError
from control.kube.source import istio_resources
from control.kube.workloads import pod_workload
from tests.support.kubeapi import pod


def obj(name: str, rv: int, **extra: object) -> dict[str, object]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": str(rv)}, **extra}


def test_list_then_events_track_resource_version_and_changes() -> None:
    r = Reflector()
    assert not r.synced
    r.listed([obj("a", 3)], "10")
    assert r.synced and r.changed and r.resource_version == "10" and r.relists == 0
    r.changed = False
    assert r.event({"type": "ADDED", "object": obj("b", 11)}) is Next.CONTINUE
    assert r.changed and set(r.store) == {("ns", "a"), ("ns", "b")}
    r.changed = False
    # A bookmark moves the resume point and changes nothing.
    r.event({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}})
    assert not r.changed and r.resource_version == "15" and r.bookmarks == 1
    # The same object again (a resync) is not a change.
    r.event({"type": "MODIFIED", "object": obj("b", 11)})
    assert not r.changed
    r.event({"type": "DELETED", "object": obj("a", 16)})
    assert r.changed and set(r.store) == {("ns", "b")} and r.resource_version == "16"


def test_410_asks_for_a_relist_which_replaces_the_store() -> None:
    r = Reflector()
    r.listed([obj("a", 1), obj("b", 2)], "5")
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    assert r.event(gone) is Next.RELIST
    r.changed = False
    r.listed([obj("b", 2), obj("c", 7)], "9")  # "a" was deleted while we were not watching
    assert r.changed and set(r.store) == {("ns", "b"), ("ns", "c")} and r.relists == 1


def test_other_watch_errors_and_garbage_raise() -> None:
    r = Reflector()
    with pytest.raises(WatchError):
        r.event({"type": "ERROR", "object": {"code": 500, "message": "etcd down"}})
    with pytest.raises(WatchError):
        r.event({"type": "ADDED"})
    with pytest.raises(WatchError):
        r.event({"type": "WHAT", "object": obj("a", 1)})


def test_backoff_grows_to_its_cap_with_jitter_and_resets() -> None:
    b = Backoff(initial=0.2, maximum=1.0, jitter=0.2, rng=random.Random(1))
    delays = [b.next_delay() for _ in range(6)]
    assert 0.16 <= delays[0] <= 0.24 and all(d <= 1.2 for d in delays)
    assert delays[-1] >= 0.8
    b.reset()
    assert b.next_delay() <= 0.24


def test_pods_become_workloads_only_when_running_ready_and_addressed() -> None:
    p = pod("web-1", "10.0.0.1", {"app": "web", "security.istio.io/tlsMode": "istio"})
    p["spec"]["serviceAccountName"] = "web"
    p["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": 8080}]
    wl = pod_workload(p)
    assert wl is not None
    assert (wl.name, wl.namespace, wl.address, wl.service_account) == (
        "web-1",
        "default",
        "10.0.0.1",
        "web",
    )
    assert dict(wl.labels)["app"] == "web" and wl.has_sidecar and wl.ports == (("http", 8080),)
    assert pod_workload(pod("x", "10.0.0.2", {}, ready=False)) is None
    pending = pod("y", "10.0.0.3", {})
    pending["status"]["phase"] = "Pending"
    assert pod_workload(pending) is None
    deleting = pod("z", "10.0.0.4", {})
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert pod_workload(deleting) is None
    plain = pod_workload(pod("w", "10.0.0.5", {"app": "w"}))
    assert plain is not None and not plain.has_sidecar and not plain.proxyless


def test_pods_injected_with_istios_proxyless_template_are_proxyless() -> None:
    p = pod("g-1", "10.0.0.6", {"app": "g"})
    p["metadata"]["annotations"] = {"inject.istio.io/templates": "sidecar, grpc-agent"}
    wl = pod_workload(p)
    assert wl is not None and wl.proxyless and not wl.has_sidecar


def test_istio_resources_follow_the_supported_kinds() -> None:
    paths = {r.path for r in istio_resources()}
    assert "/apis/networking.istio.io/v1/serviceentries" in paths
    assert "/apis/security.istio.io/v1/authorizationpolicies" in paths
    assert all(r.api_version.endswith("/v1") for r in istio_resources())
