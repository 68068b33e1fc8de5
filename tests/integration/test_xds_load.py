"""The xDS load tool (tests/benchmarks/xds_load.py) against a real control plane: simulated
proxies in worker processes on real gRPC streams, SotW and delta, through a short endpoint
churn made by rewriting config files. The benchmarks trust its figures; this is why."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

from tests.benchmarks.xds_load import LoadClients, LoadOptions, check_acks
from tests.benchmarks.xds_mesh import MeshFiles
from tests.support.controlplane import eventually, running_control_plane

PROXIES = 20  # per mode
SERVICES = 4
CHANGES = 4


def _pushz(port: int) -> dict:  # type: ignore[type-arg]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/pushz", timeout=5) as r:
        return dict(json.loads(r.read()))


async def test_load_tool_converges_and_acks_every_response_through_churn(tmp_path: Path) -> None:
    mesh = MeshFiles(tmp_path / "mesh", SERVICES, 2, group=2)
    mesh.write()
    async with running_control_plane(mesh.root, secure=False) as cp:
        target = f"127.0.0.1:{cp.xds_port}"
        sotw = LoadClients(LoadOptions(target, PROXIES, workers=1, per_channel=8))
        delta = LoadClients(
            LoadOptions(target, PROXIES, workers=1, per_channel=8, delta=True, first_index=PROXIES)
        )
        async with sotw, delta:
            for load in (sotw, delta):
                await load.wait_converged(30)
            await eventually(lambda: len(cp.xds.connections) == 2 * PROXIES, what="streams")
            pushes_before = cp.pushes

            for _ in range(CHANGES):
                mesh.change()
                await asyncio.sleep(0.2)  # several pushes, not one
            for load in (sotw, delta):
                await load.wait_for(
                    lambda s: s["marker_min"] >= CHANGES and s["converged_now"] == PROXIES,
                    30,
                    "every proxy to have every change",
                )
            records = {"sotw": await sotw.report(), "delta": await delta.report()}
            statuses = {"sotw": sotw.status(), "delta": delta.status()}
            pushz = await asyncio.to_thread(_pushz, cp.http_port)
            # Every ACK a proxy sent reaches the control plane.
            sent = sum(sum(s["acks"].values()) for s in statuses.values())
            await eventually(lambda: cp.xds.acks == sent, what=f"{sent} ACKs at the server")

        for mode, recs in records.items():
            assert len(recs) == PROXIES
            assert check_acks(recs) == [], mode  # no stream errors, one ACK per response
            for r in recs:
                # One response per wildcard or named subscription at connection time, then
                # the churn reached EDS only (the incremental push).
                assert r["responses"]["CDS"] == r["responses"]["LDS"] == 1, (mode, r)
                assert r["responses"]["RDS"] == 1, (mode, r)
                assert r["responses"]["EDS"] >= 2, (mode, r)
                assert r["markers"][-1][0] == CHANGES, (mode, r)
                assert r["converged"] and r["streams"] == 1
                assert r["connected_at"] <= r["converged_at"] <= r["markers"][0][1]
            assert statuses[mode]["failures"] == 0

    pushes = [p for p in pushz["recent"] if p["seq"] > pushes_before]
    assert pushes and all(p["eds_only"] for p in pushes)
    for p in pushes:
        assert p["config_snapshot_monotonic"] <= p["started_monotonic"]
        assert p["streams"] == 2 * PROXIES and p["reasons"] == ["config"]
