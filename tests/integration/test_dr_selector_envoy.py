"""Acceptance: a DestinationRule with a `workloadSelector` applies to the clients of its
namespace that have the labels, before the namespace's rule without one; other clients keep
that one. Measured with two real Envoys in one namespace calling the same host: the same
subset name means another version to each."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.integration.test_traffic_envoy import Client, envoy_for
from tests.support.apps import EchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.envoy import EnvoyProcess
from tests.support.net import pod_ip
from tests.support.traffic import service, workload_entry

pytestmark = pytest.mark.envoy

RULES = """
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: pinned, namespace: default}
spec:
  hosts: [pinned]
  http: [{route: [{destination: {host: pinned, subset: stable}}]}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: pinned, namespace: default}
spec:
  host: pinned
  subsets: [{name: stable, labels: {version: v1}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: pinned-testers, namespace: default}
spec:
  host: pinned
  workloadSelector: {matchLabels: {role: tester}}
  subsets: [{name: stable, labels: {version: v2}}]
"""


async def test_a_selected_rule_applies_to_its_clients_only(tmp_path: Path) -> None:
    ips = {n: pod_ip() for n in ("v1", "v2", "tester", "plain")}
    apps = [EchoApp("v1", ips["v1"], 8080), EchoApp("v2", ips["v2"], 8080)]
    for app in apps:
        await app.start()
    cfg = tmp_path / "config"
    cfg.mkdir()
    mesh = "".join(
        [
            service("pinned", "pinned"),
            workload_entry("pinned-v1", ips["v1"], app="pinned", version="v1"),
            workload_entry("pinned-v2", ips["v2"], app="pinned", version="v2"),
            RULES,
        ]
    )
    (cfg / "mesh.yaml").write_text(textwrap.dedent(mesh))
    tester, plain = Client(ips["tester"]), Client(ips["plain"])
    envoys: list[EnvoyProcess] = []
    try:
        async with running_control_plane(cfg) as cp:
            assert not cp.watcher.errors
            assert [str(w) for w in cp.watcher.current.warnings] == []
            labels = {"app": "tester", "role": "tester"}
            envoys.append(envoy_for(cp, ips["tester"], "tester", labels, tmp_path / "e1"))
            envoys.append(envoy_for(cp, ips["plain"], "plain", {"app": "plain"}, tmp_path / "e2"))
            for client in (tester, plain):
                await eventually(lambda c=client: _ok(c), timeout=30, what="routes")
            assert await tester.tally(30, "pinned") == {(200, "v2"): 30}
            assert await plain.tally(30, "pinned") == {(200, "v1"): 30}
    finally:
        for e in envoys:
            e.stop()
        await tester.close()
        await plain.close()
        for app in apps:
            await app.close()


async def _ok(client: Client) -> bool:
    return (await client.get("pinned"))[0] == 200
