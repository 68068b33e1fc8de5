"""A VirtualService `sourceLabels` match at a gateway, measured with real Envoy: two routers
(real Envoy connected straight to the control plane as `router~` nodes) serve one Istio
Gateway; the match is for routers labelled zone=canary, so the canary router sends the host's
traffic to v2 and the other router, whose labels differ only there, to v1 (as in Istio, where
the gateway pod's labels are the ones matched). Both answer a 210 KB direct response."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from control.app import ControlPlane
from tests.support.apps import EchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.envoy import EnvoyProcess, direct_envoy
from tests.support.gateways import http_get
from tests.support.net import pod_ip
from tests.support.traffic import versioned_reviews

pytestmark = pytest.mark.envoy

GATEWAY_PORT = 8080
HOST = "shop.example.com"
# A direct response body far above Envoy's default limit (4 KB): a gateway's route table
# must raise it (to Istio's 1 MiB) or Envoy rejects the whole table.
LARGE_BODY = "".join(f"{i:07d}" for i in range(30_000))

ROUTING = """
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
metadata: {name: shop, namespace: default}
spec:
  hosts: [shop.example.com]
  gateways: [edge/public]
  http:
  - match: [{uri: {exact: /large}}]
    directResponse: {status: 200, body: {string: LARGE_BODY}}
  - match: [{sourceLabels: {zone: canary}}]
    route: [{destination: {host: reviews, subset: v2}}]
  - route: [{destination: {host: reviews, subset: v1}}]
"""


def _router(
    cp: ControlPlane, ip: str, pod: str, labels: dict[str, str], workdir: Path
) -> EnvoyProcess:
    return direct_envoy(
        cp.xds_port, ip, pod, workdir, labels=labels, namespace="edge", proxy_type="router"
    )


async def _app(ip: str) -> str:
    """The backend that answered a request through the router at `ip` ("" when none did)."""
    status, _, body = await http_get(ip, GATEWAY_PORT, "/", HOST)
    return str(json.loads(body)["app"]) if status == 200 else ""


async def test_source_labels_match_the_routers_own_labels(tmp_path: Path) -> None:
    ips = {n: pod_ip() for n in ("v1", "v2", "canary", "stable")}
    apps = [EchoApp("v1", ips["v1"], 8080), EchoApp("v2", ips["v2"], 8080)]
    for app in apps:
        await app.start()
    cfg = tmp_path / "config"
    cfg.mkdir()
    routing = textwrap.dedent(ROUTING).replace("LARGE_BODY", LARGE_BODY)
    mesh = versioned_reviews(ips["v1"], ips["v2"]) + routing
    (cfg / "mesh.yaml").write_text(mesh)
    envoys: list[EnvoyProcess] = []
    try:
        async with running_control_plane(cfg) as cp:
            assert not cp.watcher.errors
            assert [str(w) for w in cp.watcher.current.warnings] == []
            gateway = {"istio": "ingressgateway"}
            canary_labels = {**gateway, "zone": "canary"}
            envoys.append(_router(cp, ips["canary"], "canary", canary_labels, tmp_path / "c"))
            envoys.append(_router(cp, ips["stable"], "stable", gateway, tmp_path / "s"))
            for name in ("canary", "stable"):
                await eventually(
                    lambda ip=ips[name]: _served(ip), timeout=30, what=f"{name} router routes"
                )
            canary = Counter([await _app(ips["canary"]) for _ in range(20)])
            stable = Counter([await _app(ips["stable"]) for _ in range(20)])
            assert canary == {"v2": 20}, canary
            assert stable == {"v1": 20}, stable
            for ip in (ips["canary"], ips["stable"]):
                status, _, body = await http_get(ip, GATEWAY_PORT, "/large", HOST)
                assert (status, body) == (200, LARGE_BODY)
    finally:
        for e in envoys:
            e.stop()
        for app in apps:
            await app.close()


async def _served(ip: str) -> bool:
    return await _app(ip) != ""
