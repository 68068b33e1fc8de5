"""VirtualService delegation measured with real Envoy, at a sidecar and at a gateway: root
VirtualServices (one for the mesh host, one bound to an Istio Gateway) hand `/api` over to a
delegate VirtualService in its own file, which sends `/api/v2` to backend v2 and the rest of
`/api` to v1; the roots' own catch-all goes to v1. Then only the delegate's file is edited
(the two subsets swapped) and both Envoys must follow. The root route's request header
(inherited by the delegate's routes, as in Istio) reaches the backends."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import pytest

from control.app import ControlPlane
from tests.support.apps import EchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.envoy import EnvoyProcess, direct_envoy
from tests.support.gateways import http_get, istio_gateway
from tests.support.net import pod_ip
from tests.support.traffic import HTTP_PORT, versioned_reviews

pytestmark = pytest.mark.envoy

GATEWAY_PORT = 8080
SHOP = "shop.example.com"

GATEWAY = istio_gateway(
    "public",
    "- port: {number: 8080, name: http, protocol: HTTP}\n  hosts: [shop.example.com]",
    namespace="edge",
)
ROOTS = """
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews-root, namespace: front}
spec:
  hosts: [reviews.default.svc.cluster.local]
  http:
  - match: [{uri: {prefix: /api}}]
    delegate: {name: api, namespace: default}
    headers: {request: {set: {x-root: sidecar}}}
  - route: [{destination: {host: reviews.default.svc.cluster.local, subset: v1}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: shop-root, namespace: front}
spec:
  hosts: [shop.example.com]
  gateways: [edge/public]
  http:
  - match: [{uri: {prefix: /api}}]
    delegate: {name: api, namespace: default}
    headers: {request: {set: {x-root: gateway}}}
  - route: [{destination: {host: reviews.default.svc.cluster.local, subset: v1}}]
"""


def delegate(api_v2: str, api_rest: str) -> str:
    return textwrap.dedent(
        f"""
        apiVersion: networking.istio.io/v1
        kind: VirtualService
        metadata: {{name: api, namespace: default}}
        spec:
          exportTo: [front]
          http:
          - match: [{{uri: {{prefix: /api/v2}}}}]
            route: [{{destination: {{host: reviews, subset: {api_v2}}}}}]
          - route: [{{destination: {{host: reviews, subset: {api_rest}}}}}]
        """
    )


def _envoy(cp: ControlPlane, ip: str, pod: str, workdir: Path, router: bool) -> EnvoyProcess:
    if router:
        labels, namespace, kind = {"istio": "ingressgateway"}, "edge", "router"
    else:
        labels, namespace, kind = {"app": "client"}, "front", "sidecar"
    return direct_envoy(
        cp.xds_port, ip, pod, workdir, labels=labels, namespace=namespace, proxy_type=kind
    )


Fetch = Callable[[str], Awaitable[str]]


def _fetcher(ip: str, port: int, host: str) -> Fetch:
    async def fetch(path: str) -> str:
        """The backend that answered `path` ("" when none did)."""
        status, _, body = await http_get(ip, port, path, host)
        return str(json.loads(body)["app"]) if status == 200 else ""

    return fetch


async def _answers(fetch: Fetch) -> tuple[str, ...]:
    return tuple([await fetch(p) for p in ("/api/v2/x", "/api/x", "/api", "/other")])


async def test_delegated_routes_and_a_delegate_edit_reach_envoy(tmp_path: Path) -> None:
    ips = {n: pod_ip() for n in ("v1", "v2", "client", "router")}
    apps = {name: EchoApp(name, ips[name], 8080) for name in ("v1", "v2")}
    for app in apps.values():
        await app.start()
    cfg = tmp_path / "config"
    cfg.mkdir()
    mesh = versioned_reviews(ips["v1"], ips["v2"]) + GATEWAY + textwrap.dedent(ROOTS)
    (cfg / "mesh.yaml").write_text(mesh)
    (cfg / "delegate.yaml").write_text(delegate("v2", "v1"))
    envoys: list[EnvoyProcess] = []
    try:
        async with running_control_plane(cfg) as cp:
            assert not cp.watcher.errors
            assert [str(w) for w in cp.watcher.current.warnings] == []
            envoys.append(_envoy(cp, ips["client"], "client", tmp_path / "s", router=False))
            envoys.append(_envoy(cp, ips["router"], "ingress", tmp_path / "g", router=True))
            sidecar = _fetcher(ips["client"], HTTP_PORT, "reviews.default.svc.cluster.local")
            gateway = _fetcher(ips["router"], GATEWAY_PORT, SHOP)
            before = ("v2", "v1", "v1", "v1")
            for fetch, what in ((sidecar, "sidecar"), (gateway, "gateway")):
                await eventually(partial(_is, fetch, before), 30, what=f"{what} routes")
            # The root route's header, inherited by the delegate's routes, and only theirs.
            seen = [h.get("x-root") for app in apps.values() for h in app.headers_seen]
            assert {"sidecar", "gateway", None} == set(seen), seen

            # Only the delegate changes; the roots' file is untouched.
            (cfg / "delegate.yaml").write_text(delegate("v1", "v2"))
            after = ("v1", "v2", "v2", "v1")
            for fetch, what in ((sidecar, "sidecar"), (gateway, "gateway")):
                await eventually(partial(_is, fetch, after), 30, what=f"{what} delegate edit")
            assert not cp.watcher.errors
            for fetch in (sidecar, gateway):
                for _ in range(5):
                    assert await _answers(fetch) == after
    finally:
        for e in envoys:
            e.stop()
        for app in apps.values():
            await app.close()


async def _is(fetch: Fetch, want: tuple[str, ...]) -> bool:
    return await _answers(fetch) == want
