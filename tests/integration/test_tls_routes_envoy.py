"""Acceptance: VirtualService `tls` routes at a sidecar (mode NONE), as Istio: TLS that the
app originates is routed by its SNI, without being terminated, to the route's destination.
Measured with a real Envoy and two TLS servers behind one service; without the route the
sidecar balances over both."""

from __future__ import annotations

import asyncio
import ssl
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from tests.integration.test_traffic_envoy import envoy_for
from tests.support.controlplane import eventually, running_control_plane
from tests.support.envoy import EnvoyProcess
from tests.support.gateways import TlsBackend
from tests.support.net import pod_ip
from tests.support.testca import TestCA
from tests.support.traffic import service, subsets_rule, workload_entry

pytestmark = pytest.mark.envoy

PORT = 9443
HOST = "secure.default.svc.cluster.local"
ROUTE = f"""
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: secure, namespace: default}}
spec:
  hosts: [secure]
  tls:
  - match: [{{sniHosts: [{HOST}], port: {PORT}}}]
    route: [{{destination: {{host: secure, subset: v2}}}}]
"""


def mesh_yaml(ips: dict[str, str], routed: bool) -> str:
    return textwrap.dedent(
        "".join(
            [
                service("secure", "secure", PORT, PORT, "tls"),
                workload_entry("secure-v1", ips["v1"], app="secure", version="v1"),
                workload_entry("secure-v2", ips["v2"], app="secure", version="v2"),
                subsets_rule("secure"),
                ROUTE if routed else "",
            ]
        )
    )


async def hello(ip: str, sni: str) -> str:
    """One TLS connection through the sidecar's outbound listener: the server's name."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(ip, PORT, ssl=ctx, server_hostname=sni), 5
        )
    except (OSError, ssl.SSLError, TimeoutError):
        return ""
    try:
        writer.write(b"GET / HTTP/1.1\r\nHost: secure\r\n\r\n")
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 5)
        return data.rpartition(b"\r\n\r\n")[2].decode()
    except (OSError, ssl.SSLError, TimeoutError):
        return ""
    finally:
        writer.close()


async def test_tls_routes_pick_the_destination_by_sni(tmp_path: Path) -> None:
    ips = {n: pod_ip() for n in ("v1", "v2", "client")}
    cert = TestCA().server_cert([HOST]).write(tmp_path, "secure")
    backends = [TlsBackend(ips[v], PORT, cert, v) for v in ("v1", "v2")]
    for b in backends:
        await b.start()
    cfg = tmp_path / "config"
    cfg.mkdir()
    mesh = cfg / "mesh.yaml"
    mesh.write_text(mesh_yaml(ips, routed=False))
    envoy: EnvoyProcess | None = None
    try:
        async with running_control_plane(cfg) as cp:
            assert not cp.watcher.errors
            envoy = envoy_for(cp, ips["client"], "client", {"app": "client"}, tmp_path / "e")
            await eventually(lambda: hello(ips["client"], HOST), timeout=30, what="listener")
            # No route: the service's own chain balances over both servers.
            plain = Counter([await hello(ips["client"], HOST) for _ in range(40)])
            assert plain["v1"] > 0 and plain["v2"] > 0, plain

            mesh.write_text(mesh_yaml(ips, routed=True))
            assert not cp.watcher.errors
            await eventually(
                lambda: _only_v2(ips["client"]), timeout=30, what="the tls route applied"
            )
            routed = Counter([await hello(ips["client"], HOST) for _ in range(40)])
            assert routed == {"v2": 40}, routed
            assert [str(w) for w in cp.watcher.current.warnings] == []
    finally:
        if envoy is not None:
            envoy.stop()
        for b in backends:
            await b.close()


async def _only_v2(ip: str) -> bool:
    return {await hello(ip, HOST) for _ in range(6)} == {"v2"}
