"""/debug/configz shows Gateway API objects with their plain kind, and the status computed
for each (as Kubernetes mode writes it, without the transition times)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp

from control.config.errors import ConfigError
from control.debug import DebugServer
from control.model.proxy import Proxy
from control.model.types import MeshConfig
from control.xds.cache import ResourceSet
from tests.support.gatewayapi import gateway, gateway_class, load, route, service
from tests.support.net import pod_ip


class _Config:
    def __init__(self, mesh: MeshConfig) -> None:
        self.current = mesh
        self.errors: Mapping[str, ConfigError] = {}

    def status(self) -> Mapping[str, object]:
        return {}


class _Streams:
    def syncz(self) -> list[dict[str, Any]]:
        return []

    def connections(self) -> list[dict[str, Any]]:
        return []

    def proxy(self, name: str) -> Proxy | None:
        return None


class _Pushes:
    pushes = 0
    push_log: tuple[Any, ...] = ()


def _no_resources(proxy: Proxy, types: Iterable[str]) -> Mapping[str, ResourceSet]:
    return {}


async def test_configz_shows_gateway_api_status() -> None:
    mesh = load(gateway_class(), service("v1"), gateway(), route("r", "infra"))
    server = DebugServer(
        ready=lambda: True,
        metrics=lambda: b"",
        streams=_Streams(),
        config=_Config(mesh),
        pushes=_Pushes(),
        resources=_no_resources,
    )
    host = pod_ip()
    port = await server.start(f"{host}:0")
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://{host}:{port}/debug/configz") as r:
                assert r.status == 200
                body = json.loads(await r.text())
    finally:
        await server.close()
    kinds = sorted(o["kind"] for o in body["objects"])
    assert kinds == ["Gateway", "GatewayClass", "HTTPRoute", "Service"]
    by_object = {(s["kind"], s["namespace"], s["name"]): s["status"] for s in body["gatewayStatus"]}
    (parent,) = by_object[("HTTPRoute", "infra", "r")]["parents"]
    assert {c["type"]: c["reason"] for c in parent["conditions"]} == {
        "Accepted": "Accepted",
        "ResolvedRefs": "ResolvedRefs",
    }
    assert by_object[("Gateway", "infra", "gw")]["listeners"][0]["attachedRoutes"] == 1
    assert ("GatewayClass", "", "pilotfish") in by_object
