"""pilotfish-ctl against a real control plane and two real pods (agent + Envoy + app):
proxy-status over xDS syncz, proxy-config from the pod's Envoy admin and from the control
plane's config_dump, JSON output, clean errors, and piping into a reader that leaves early."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.support.apps import EchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.mesh import backend_yaml, mesh_agent
from tests.support.net import free_port, pod_ip

pytestmark = pytest.mark.envoy

ROOT = Path(__file__).resolve().parents[2]

MESH = backend_yaml()


async def ctl(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "control.ctl",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def get(url: str, host: str | None = None) -> int:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s,
            s.get(url, headers={"Host": host} if host else {}) as r,
        ):
            await r.read()
            return r.status
    except (aiohttp.ClientError, TimeoutError):
        return 0


def columns(table: str) -> tuple[list[str], list[list[str]]]:
    """Split a ctl table on runs of two or more spaces (cells never hold two spaces)."""
    import re

    lines = table.rstrip("\n").splitlines()
    split = [re.split(r" {2,}", ln.strip()) for ln in lines]
    return split[0], split[1:]


async def test_proxy_status_and_proxy_config(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    client_ip, backend_ip = pod_ip(), pod_ip()
    app = EchoApp("backend", backend_ip, 8080)
    await app.start()
    async with running_control_plane(cfg) as cp:
        xds = f"127.0.0.1:{cp.xds_port}"
        http = f"127.0.0.1:{cp.http_port}"
        # Agents on the TLS port with tokens; the backend registers through its group.
        backend = mesh_agent(cp, tmp_path, backend_ip, "backend", "app=backend", group="backend")
        client = mesh_agent(cp, tmp_path, client_ip, "client", "app=client")
        backend.start()
        client.start()
        try:
            await eventually(
                lambda: _is(get(f"http://{client_ip}:9080/hello", "backend"), 200),
                timeout=40,
                what="client -> backend",
            )

            # proxy-status: one row per pod (its Envoy stream and agent stream are one
            # proxy), every type SYNCED, the replica's id.
            async def all_synced() -> list[list[str]] | None:
                code, out, err = await ctl("proxy-status", "--xds-address", xds)
                assert code == 0, err
                headers, rows = columns(out)
                assert headers == ["NAME", "IP", "REPLICA", "CDS", "LDS", "EDS", "RDS", "NDS"]
                # The backend has no RDS: its only HTTP listener is inbound, with its
                # route inline.
                done = len(rows) == 2 and all(set(r[3:]) <= {"SYNCED", "-"} for r in rows)
                return rows if done else None

            rows = await eventually(all_synced, timeout=20, what="both proxies SYNCED")
            assert sorted((r[0], r[1], r[2]) for r in rows) == [
                ("backend.default", backend_ip, "test-cp"),
                ("client.default", client_ip, "test-cp"),
            ]
            client_states = next(r[3:] for r in rows if r[1] == client_ip)
            assert client_states == ["SYNCED"] * 5
            code, out, err = await ctl("proxy-status", "--xds-address", xds, "-o", "json")
            assert code == 0, err
            data = json.loads(out)
            assert {d["ip"] for d in data} == {client_ip, backend_ip}
            client_row = next(d for d in data if d["ip"] == client_ip)
            assert client_row["proxy"].startswith(f"sidecar~{client_ip}~client.default~")
            assert client_row["streams"] == 2  # Envoy's ADS and the agent's own stream
            assert client_row["types"]["CDS"]["state"] == "SYNCED"
            assert client_row["types"]["CDS"]["version"]

            # A replica that is not there: the error names it, the others still print.
            dead = f"127.0.0.1:{free_port()}"
            code, out, err = await ctl(
                "proxy-status", "--xds-address", f"{xds},{dead}", "--timeout", "2"
            )
            assert code == 1
            assert dead in err and "Traceback" not in err
            assert len(columns(out)[1]) == 2

            # proxy-config from the client's Envoy admin: what Envoy holds.
            code, out, err = await ctl("proxy-config", "clusters", client_ip)
            assert code == 0, err
            headers, rows = columns(out)
            assert headers == ["SERVICE FQDN", "PORT", "SUBSET", "DIRECTION", "TYPE"]
            assert ["backend.default.svc.cluster.local", "9080", "-", "outbound", "EDS"] in rows

            code, out, err = await ctl("proxy-config", "endpoints", client_ip)
            assert code == 0, err
            headers, rows = columns(out)
            assert headers == ["ENDPOINT", "STATUS", "WEIGHT", "CLUSTER"]
            backend_rows = [r for r in rows if r[3].endswith("backend.default.svc.cluster.local")]
            assert [r[0] for r in backend_rows] == [f"{backend_ip}:9080"]

            code, out, err = await ctl("proxy-config", "listeners", client_ip)
            assert code == 0, err
            headers, rows = columns(out)
            assert [client_ip, "9080"] in [r[:2] for r in rows]
            dest = next(r[3] for r in rows if r[:2] == [client_ip, "9080"])
            assert dest == "Route: 9080"

            code, out, err = await ctl("proxy-config", "routes", client_ip)
            assert code == 0, err
            headers, rows = columns(out)
            assert headers == ["NAME", "VIRTUAL HOST", "DOMAINS", "MATCH", "CLUSTER"]
            assert any(
                r[0] == "9080" and r[4] == "outbound|9080||backend.default.svc.cluster.local"
                for r in rows
            ), rows

            code, out, err = await ctl("proxy-config", "secret", client_ip)
            assert code == 0, err
            headers, rows = columns(out)
            by_name = {r[0]: r for r in rows}
            assert by_name["default"][1:3] == ["Cert Chain", "true"]
            assert by_name["ROOTCA"][1:3] == ["CA", "true"]
            assert int(by_name["ROOTCA"][3], 16) == cp.ca.root.serial_number  # type: ignore[union-attr]

            # The same through the control plane (what it generates for that proxy).
            code, out, err = await ctl(
                "proxy-config", "clusters", "client.default", "--http-address", http
            )
            assert code == 0, err
            assert ["backend.default.svc.cluster.local", "9080", "-", "outbound", "EDS"] in (
                columns(out)[1]
            )
            code, out, err = await ctl(
                "proxy-config", "clusters", "client.default", "--http-address", http, "-o", "json"
            )
            names = [c["name"] for c in json.loads(out)]
            assert "outbound|9080||backend.default.svc.cluster.local" in names

            # Clear one-line errors: unknown proxy, secrets from the control plane.
            code, out, err = await ctl(
                "proxy-config", "clusters", "nobody.default", "--http-address", http
            )
            assert code == 1 and "404" in err and "Traceback" not in err
            code, out, err = await ctl(
                "proxy-config", "secret", "client.default", "--http-address", http
            )
            assert code == 1 and "pod IP" in err

            # Piped into a reader that leaves after one line: no traceback, no error.
            pipe = subprocess.run(
                f"{sys.executable} -m control.ctl proxy-config clusters {client_ip} | head -1",
                shell=True,
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert pipe.stdout.startswith("SERVICE FQDN")
            assert "Traceback" not in pipe.stderr, pipe.stderr
        finally:
            client.kill()
            backend.kill()
    await app.close()


async def _is(call: object, want: int) -> bool:
    return bool(await call == want)  # type: ignore[misc]
