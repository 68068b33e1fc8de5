"""The Gateway API in Kubernetes mode, against the in-test API server: the kinds are listed
and watched, translated like files, and their status is written back through the status
subresource (PATCH .../status, merge patch), only when it changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from control.kube.client import from_kubeconfig
from control.kube.source import KubeSource
from control.model.gatewayapi import CONTROLLER_NAME, GROUP
from control.model.types import MeshConfig
from tests.support.controlplane import eventually
from tests.support.gatewayapi import (
    backend,
    gateway,
    gateway_class,
    listener,
    reference_grant,
    route,
    service,
)
from tests.support.kubeapi import FakeKubeApi, pod

HTTPROUTES = f"httproutes.{GROUP}"
GATEWAYS = f"gateways.{GROUP}"
CLASSES = f"gatewayclasses.{GROUP}"


def namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/metadata.name": name, **(labels or {})},
        },
    }


def stored(api: FakeKubeApi, plural: str, ns: str, name: str) -> dict[str, Any]:
    return api.objects[plural].get((ns, name)) or {}


def route_conditions(api: FakeKubeApi, ns: str, name: str) -> dict[str, str]:
    parents = (stored(api, HTTPROUTES, ns, name).get("status") or {}).get("parents") or []
    ours = [p for p in parents if p.get("controllerName") == CONTROLLER_NAME]
    if not ours:
        return {}
    return {c["type"]: f"{c['status']}/{c['reason']}" for c in ours[0]["conditions"]}


async def kube_source(api: FakeKubeApi, tmp_path: Path) -> KubeSource:
    path = tmp_path / "kubeconfig"
    path.write_text(api.kubeconfig())
    return KubeSource(from_kubeconfig(str(path)), debounce=0.02)


def gateway_vs(config: MeshConfig) -> list[str]:
    return sorted(v.name for v in config.virtual_services if v.gateways != ("mesh",))


async def test_status_is_written_back_and_follows_reference_grants(tmp_path: Path) -> None:
    async with FakeKubeApi(bookmark_interval=0.1) as api:
        for ns in ("infra", "apps"):
            api.put(namespace(ns))
        api.put(gateway_class())
        api.put(gateway_class("theirs", "example.com/other"))
        api.put(service("v1"))
        api.put(gateway(listeners=[listener(from_="All")]))
        cross = route(
            "r",
            "apps",
            parents=[{"name": "gw", "namespace": "infra"}],
            hostnames=["r.example.com"],
            rules=[{"backendRefs": [backend("v1", namespace="infra")]}],
        )
        api.put(cross)
        source = await kube_source(api, tmp_path)
        async with source:
            # Refused: the backend is in another namespace and nothing grants it.
            await eventually(
                lambda: (
                    route_conditions(api, "apps", "r").get("ResolvedRefs")
                    == "False/RefNotPermitted"
                ),
                what="RefNotPermitted written",
            )
            assert route_conditions(api, "apps", "r")["Accepted"] == "True/Accepted"
            # Served as the spec says: its requests get 500 until the backend may be reached.
            (vs,) = [v for v in source.current.virtual_services if v.gateways == ("infra/gw",)]
            assert vs.http[0].fault is not None and vs.http[0].fault.abort_status == 500
            assert any(r.startswith("PATCH-STATUS httproutes") for r in api.requests)
            gw_status = stored(api, GATEWAYS, "infra", "gw")["status"]
            assert [c["reason"] for c in gw_status["conditions"]] == ["Accepted", "Programmed"]
            assert gw_status["listeners"][0]["attachedRoutes"] == 1
            gc_status = stored(api, CLASSES, "", "pilotfish")["status"]
            assert gc_status["conditions"][0]["reason"] == "Accepted"
            assert "status" not in stored(api, CLASSES, "", "theirs")  # not ours
            first_time = {
                c["type"]: c["lastTransitionTime"]
                for c in stored(api, HTTPROUTES, "apps", "r")["status"]["parents"][0]["conditions"]
            }

            # Granted: the route is served and its status says so.
            api.put(reference_grant("apps-to-infra", "infra", "apps"))
            await eventually(
                lambda: (
                    route_conditions(api, "apps", "r").get("ResolvedRefs") == "True/ResolvedRefs"
                ),
                what="ResolvedRefs written",
            )
            await eventually(
                lambda: (
                    [
                        r.destinations[0].host
                        for v in source.current.virtual_services
                        if v.gateways == ("infra/gw",)
                        for r in v.http
                    ]
                    == ["v1.infra.svc.cluster.local"]
                ),
                what="route served",
            )
            conditions = stored(api, HTTPROUTES, "apps", "r")["status"]["parents"][0]["conditions"]
            times = {c["type"]: c["lastTransitionTime"] for c in conditions}
            assert times["Accepted"] == first_time["Accepted"]  # unchanged condition

            # Nothing changed for the Gateway API: nothing more is written.
            await eventually(
                lambda: source.status_writer.writes == api.status_patches,
                what="writes settled",
            )
            patches = api.status_patches
            api.put(pod("web-0", "10.0.0.1", {"app": "web"}))
            await eventually(
                lambda: any(w.address == "10.0.0.1" for w in source.current.workload_entries),
                what="unrelated change seen",
            )
            assert api.status_patches == patches

            # Someone else overwrites our status: it is written again.
            obj = stored(api, HTTPROUTES, "apps", "r")
            api.put({**obj, "status": {"parents": []}})
            await eventually(
                lambda: route_conditions(api, "apps", "r").get("Accepted") == "True/Accepted",
                what="status restored",
            )


async def test_allowed_routes_selector_follows_namespace_labels(tmp_path: Path) -> None:
    async with FakeKubeApi(bookmark_interval=0.1) as api:
        api.put(namespace("infra"))
        api.put(namespace("apps"))
        api.put(gateway_class())
        api.put(service("v1", "apps"))
        selector = {"matchLabels": {"gateway-access": "yes"}}
        api.put(gateway(listeners=[listener(from_="Selector", selector=selector)]))
        api.put(route("r", "apps", parents=[{"name": "gw", "namespace": "infra"}]))
        source = await kube_source(api, tmp_path)
        async with source:
            await eventually(
                lambda: (
                    route_conditions(api, "apps", "r").get("Accepted")
                    == "False/NotAllowedByListeners"
                ),
                what="refused by the selector",
            )
            api.put(namespace("apps", {"gateway-access": "yes"}))
            await eventually(
                lambda: route_conditions(api, "apps", "r").get("Accepted") == "True/Accepted",
                what="accepted once labelled",
            )
            assert gateway_vs(source.current) == ["gw-8080-wildcard"]
            assert [g.name for g in source.current.gateways] == ["gw"]
            # The source's summary names the Gateway API resources apart from others.
            assert f"Gateway.{GROUP}" in source.status()["resources"]  # type: ignore[operator]


async def test_gateway_api_crds_not_installed_is_no_error(tmp_path: Path) -> None:
    async with FakeKubeApi(bookmark_interval=0.1) as api:
        for plural in list(api.objects):
            if plural.endswith(GROUP):
                api.unserved.add(plural)
        api.put(service("v1", "default"))
        source = await kube_source(api, tmp_path)
        async with source:
            assert [s.name for s in source.current.services] == ["v1"]
            assert source.current.gateways == ()
