"""Gateway API status as written: transition times kept, other controllers' entries kept,
nothing written when nothing changed."""

from __future__ import annotations

from typing import Any

from control.gatewayapi.status import patch, render
from control.model.gatewayapi import CONTROLLER_NAME, ObjectStatus
from tests.support.gatewayapi import (
    backend,
    gateway,
    gateway_class,
    load,
    route,
    service,
    status_of,
)

T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-01T00:05:00Z"


def _route_status(backends: list[Any]) -> ObjectStatus:
    mesh = load(
        gateway_class(), service("v1"), gateway(), route("r", rules=[{"backendRefs": backends}])
    )
    return status_of(mesh, "HTTPRoute", "infra", "r")


def test_route_status_shape() -> None:
    body = patch(_route_status([backend("v1")]), None, T0)
    assert body is not None
    (parent,) = body["status"]["parents"]
    assert parent["parentRef"] == {"name": "gw"}
    assert parent["controllerName"] == CONTROLLER_NAME
    assert [(c["type"], c["status"], c["reason"]) for c in parent["conditions"]] == [
        ("Accepted", "True", "Accepted"),
        ("ResolvedRefs", "True", "ResolvedRefs"),
    ]
    assert all(c["lastTransitionTime"] == T0 for c in parent["conditions"])


def test_unchanged_status_is_not_written_again() -> None:
    status = _route_status([backend("v1")])
    first = patch(status, None, T0)
    assert first is not None
    assert patch(status, first["status"], T1) is None


def test_a_changed_condition_gets_a_new_time_and_the_others_keep_theirs() -> None:
    before = patch(_route_status([backend("v1")]), None, T0)
    assert before is not None
    after = patch(_route_status([backend("missing")]), before["status"], T1)
    assert after is not None
    conditions = {c["type"]: c for c in after["status"]["parents"][0]["conditions"]}
    assert conditions["Accepted"]["lastTransitionTime"] == T0
    assert conditions["ResolvedRefs"]["lastTransitionTime"] == T1
    assert conditions["ResolvedRefs"]["reason"] == "BackendNotFound"


def test_entries_of_other_controllers_are_kept() -> None:
    theirs = {
        "parentRef": {"name": "other-gw"},
        "controllerName": "example.com/else",
        "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}],
    }
    body = patch(_route_status([backend("v1")]), {"parents": [theirs]}, T0)
    assert body is not None
    parents = body["status"]["parents"]
    assert parents[0] == theirs
    assert parents[1]["controllerName"] == CONTROLLER_NAME


def test_gateway_status_has_listeners_and_views_have_no_times() -> None:
    mesh = load(gateway_class(), service("v1"), gateway(), route("r"))
    status = status_of(mesh, "Gateway", "infra", "gw")
    view = render(status, None, None)
    (ls,) = view["listeners"]
    assert ls["name"] == "http" and ls["attachedRoutes"] == 1
    assert {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"} in ls["supportedKinds"]
    assert all("lastTransitionTime" not in c for c in view["conditions"])
    written = patch(status, {"addresses": [{"value": "10.0.0.1"}]}, T0)
    assert written is not None and "addresses" not in written["status"]  # not ours: untouched
