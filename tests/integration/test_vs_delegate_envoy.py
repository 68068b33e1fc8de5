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
from pathlib import Path

import pytest

from agent.envoy.bootstrap import BootstrapOptions, build_bootstrap
from control.app import ControlPlane
from tests.support.apps import EchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.envoy import EnvoyProcess
from tests.support.gateways import http_get
from tests.support.net import pod_ip
from tests.support.traffic import HTTP_PORT, service, subsets_rule, workload_entry

pytestmark = pytest.mark.envoy

GATEWAY_PORT = 8080
SHOP = "shop.example.com"

ROOTS = """
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: public, namespace: edge}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: [shop.example.com]
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
    options = BootstrapOptions(
        ip=ip,
        pod_name=pod,
        namespace="edge" if router else "front",
        proxy_type="router" if router else "sidecar",
        labels={"istio": "ingressgateway"} if router else {"app": "client"},
        xds_address=f"127.0.0.1:{cp.xds_port}",
    )
    envoy = EnvoyProcess(build_bootstrap(options), workdir, name=pod)
    envoy.start()
    return envoy


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
    mesh = "".join(
        (
            service("reviews", "reviews"),
            workload_entry("reviews-v1", ips["v1"], app="reviews", version="v1"),
            workload_entry("reviews-v2", ips["v2"], app="reviews", version="v2"),
            subsets_rule("reviews"),
            textwrap.dedent(ROOTS),
        )
    )
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
                await eventually(
                    lambda f=fetch: _is(f, before), timeout=30, what=f"{what} delegated routes"
                )
            # The root route's header, inherited by the delegate's routes, and only theirs.
            seen = [h.get("x-root") for app in apps.values() for h in app.headers_seen]
            assert {"sidecar", "gateway", None} == set(seen), seen

            # Only the delegate changes; the roots' file is untouched.
            (cfg / "delegate.yaml").write_text(delegate("v1", "v2"))
            after = ("v1", "v2", "v2", "v1")
            for fetch, what in ((sidecar, "sidecar"), (gateway, "gateway")):
                await eventually(
                    lambda f=fetch: _is(f, after), timeout=30, what=f"{what} edited delegate"
                )
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
