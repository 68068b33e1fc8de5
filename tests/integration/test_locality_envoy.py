"""Acceptance: DestinationRule `localityLbSetting` with real Envoy, as Istio documents it.
Two clients in different localities reach the same three backends (one near the first client
in its zone, one in its region's other zone, one in another region): failover prefers the
nearest healthy endpoints for each client and moves on when they fail; `distribute` splits a
client's traffic by locality. Statistical checks use about three binomial standard
deviations, never timings."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import cast

import pytest

from tests.integration.test_proxyless_grpc import backend, bootstrap, grpc_client
from tests.integration.test_traffic_envoy import Client, envoy_for
from tests.support.apps import EchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.envoy import EnvoyProcess
from tests.support.net import pod_ip
from tests.support.traffic import service

pytestmark = pytest.mark.envoy

LOCALITIES = {"near": "us-east/zone1/a", "zone2": "us-east/zone2/b", "far": "eu-west/zone1/c"}


def located(name: str, ip: str, app: str, locality: str) -> str:
    return f"""
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: {name}, namespace: default}}
spec: {{address: "{ip}", labels: {{app: {app}}}, locality: {locality}}}
"""


def mesh_yaml(ips: dict[str, str]) -> str:
    docs = [service("geo", "geo"), service("spread", "spread")]
    for name, locality in LOCALITIES.items():
        docs.append(located(f"geo-{name}", ips[name], "geo", locality))
        docs.append(located(f"spread-{name}", ips[name], "spread", locality))
    docs.append("""
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: geo, namespace: default}
spec:
  host: geo
  trafficPolicy:
    outlierDetection:
      consecutive5xxErrors: 1
      interval: 1s
      baseEjectionTime: 5m
      maxEjectionPercent: 100
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: spread, namespace: default}
spec:
  host: spread
  trafficPolicy:
    loadBalancer:
      simple: ROUND_ROBIN
      localityLbSetting:
        distribute:
        - from: us-east/zone1/*
          to: {"us-east/zone1/*": 80, "us-east/zone2/*": 20}
""")
    return "".join(docs)


async def test_locality_failover_and_distribute_with_real_envoy(tmp_path: Path) -> None:
    ips = {n: pod_ip() for n in ("near", "zone2", "far", "east", "west")}
    apps = {n: EchoApp(n, ips[n], 8080) for n in LOCALITIES}
    for app in apps.values():
        await app.start()
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(textwrap.dedent(mesh_yaml(ips)))
    east, west = Client(ips["east"]), Client(ips["west"])
    envoys: list[EnvoyProcess] = []
    try:
        async with running_control_plane(cfg) as cp:
            assert not cp.watcher.errors
            assert [str(w) for w in cp.watcher.current.warnings] == []
            # Where each client runs comes from Istio's `istio-locality` label.
            east_labels = {"app": "east", "istio-locality": "us-east.zone1.a"}
            west_labels = {"app": "west", "istio-locality": "eu-west.zone1.c"}
            envoys.append(envoy_for(cp, ips["east"], "east", east_labels, tmp_path / "e1"))
            envoys.append(envoy_for(cp, ips["west"], "west", west_labels, tmp_path / "e2"))
            await eventually(lambda: _ok(east, "geo"), timeout=30, what="east routes")
            await eventually(lambda: _ok(west, "geo"), timeout=30, what="west routes")

            # Failover: each client's traffic stays in its own locality while it is healthy.
            far_before = apps["far"].requests  # the west client's first request
            assert await east.tally(60, "geo") == {(200, "near"): 60}
            assert await west.tally(60, "geo") == {(200, "far"): 60}

            # The near endpoint fails: it is ejected, and the east client moves to its
            # region's other zone, not to the other region; the west client is untouched.
            apps["near"].fail_every, apps["near"].fail_status = 1, 503
            first = await east.tally(10, "geo")
            assert first[(503, "")] >= 1, first  # tried before it was ejected
            assert await east.tally(60, "geo") == {(200, "zone2"): 60}
            assert await west.tally(30, "geo") == {(200, "far"): 30}
            assert apps["far"].requests == far_before + 90  # only the west client's

            # distribute: 80/20 between the east client's zone and its region's other zone,
            # nothing to the other region (1,000 requests: sigma 1.3 points).
            apps["near"].fail_every = 0
            spread = await east.tally(1000, "spread")
            assert spread[(200, "near")] + spread[(200, "zone2")] == 1000, spread
            assert 16.0 <= 100 * spread[(200, "zone2")] / 1000 <= 24.0, spread
            assert apps["far"].requests == far_before + 90
            # A client no `from` matches balances over every locality.
            west_spread = await west.tally(300, "spread")
            assert west_spread[(200, "far")] > 0 and west_spread[(200, "zone2")] > 0, west_spread
    finally:
        for e in envoys:
            e.stop()
        await east.close()
        await west.close()
        for app in apps.values():
            await app.close()


async def _ok(client: Client, host: str) -> bool:
    return (await client.get(host))[0] == 200


async def test_a_proxyless_grpc_client_fails_over_by_locality(tmp_path: Path) -> None:
    """gRPC's own priorities: a proxyless client (node locality in its bootstrap) calls the
    backend in its zone, moves to the other zone when it goes down, and comes back."""
    near_ip, far_ip = pod_ip(), pod_ip()
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(
        service("echo", "echo", 7070, 8080, "grpc")
        + located("echo-near", near_ip, "echo", "us-east/zone1/a")
        + located("echo-far", far_ip, "echo", "us-east/zone2/b")
        + textwrap.dedent(
            """
            ---
            apiVersion: networking.istio.io/v1
            kind: DestinationRule
            metadata: {name: echo, namespace: default}
            spec:
              host: echo
              trafficPolicy: {outlierDetection: {consecutive5xxErrors: 1}}
            """
        )
    )
    target = "xds:///echo.default.svc.cluster.local:7070"
    async with backend("far", far_ip), running_control_plane(cfg) as cp:
        boot = tmp_path / "grpc-bootstrap.json"
        config = bootstrap(cp.xds_port)
        locality = {"region": "us-east", "zone": "zone1", "sub_zone": "a"}
        node = cast(dict[str, object], config["node"])
        boot.write_text(json.dumps({**config, "node": {**node, "locality": locality}}))
        async with grpc_client(boot, (target,)) as client:
            async with backend("near", near_ip) as near:
                await client.wait_for("near", timeout=15)
                # Its zone only, though the other zone's backend is as good (without
                # locality balancing gRPC would share the calls between them).
                assert all(line.get("backend") == "near" for line in client.lines[-20:])
                assert near.calls > 0
            # The near backend is gone: gRPC fails over to the next priority.
            await client.wait_for("far", timeout=15)
            async with backend("near", near_ip):
                # And comes back to its zone once the near backend serves again.
                await client.wait_for("near", timeout=20)
