"""Two control-plane replicas sharing one state dir (CA root and token key): agents spread
across them, certificates signed by either replica verify at the other pod (STRICT mTLS),
proxy-status lists every proxy once with its replica, and killing a replica under steady HTTP
load moves its agent to the other one with zero failed requests.

In file mode each replica only knows the proxies connected to it, so the pods are declared
with WorkloadEntry and the agents do not auto-register (ISTIO_META_AUTO_REGISTER=false); in
Kubernetes mode the pods come from the API server and every replica sees all of them.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path

import aiohttp
import pytest

from tests.e2e.test_ctl import columns, ctl
from tests.support.agentproc import AgentProcess
from tests.support.apps import EchoApp
from tests.support.controlplane import eventually, state_dir_token
from tests.support.cpproc import ControlPlaneProcess
from tests.support.net import pod_ip

pytestmark = pytest.mark.envoy

MESH = """\
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: default, namespace: istio-system}}
spec: {{mtls: {{mode: STRICT}}}}
---
apiVersion: v1
kind: Service
metadata: {{name: backend, namespace: default}}
spec:
  selector: {{app: backend}}
  ports: [{{name: http, port: 9080, targetPort: 9080}}]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: backend, namespace: default}}
spec:
  workloadSelector: {{labels: {{app: backend}}}}
  ingress:
  - port: {{number: 9080, protocol: HTTP, name: http}}
    defaultEndpoint: 0.0.0.0:8080
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: backend, namespace: default}}
spec:
  address: "{backend_ip}"
  serviceAccount: backend
  labels: {{app: backend, security.istio.io/tlsMode: istio}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: client, namespace: default}}
spec:
  address: "{client_ip}"
  serviceAccount: client
  labels: {{app: client, security.istio.io/tlsMode: istio}}
"""

NO_AUTO_REGISTER = {"ISTIO_META_AUTO_REGISTER": "false"}


async def test_two_replicas_spread_fail_over_and_proxy_status(tmp_path: Path) -> None:
    client_ip, backend_ip = pod_ip(), pod_ip()
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(
        textwrap.dedent(MESH.format(client_ip=client_ip, backend_ip=backend_ip))
    )
    state = tmp_path / "state"
    client_token = state_dir_token(state, "default", "client")
    backend_token = state_dir_token(state, "default", "backend")
    flags = ("--config", str(cfg), "--state-dir", str(state))
    cp_a = ControlPlaneProcess("cp-a", tmp_path, *flags)
    cp_b = ControlPlaneProcess("cp-b", tmp_path, *flags)
    app = EchoApp("backend", backend_ip, 8080)
    await app.start()
    # Each agent lists both replicas, its own first: pick_first spreads them, and the other
    # address is where it fails over to.
    # On the replicas' TLS ports, verified by the shared state dir's root.
    root = str(state / "root-cert.pem")
    client = AgentProcess(
        f"{cp_a.secure_xds},{cp_b.secure_xds}",
        tmp_path / "c",
        client_ip,
        "client",
        "app=client",
        "--service-account",
        "client",
        "--ca-root-cert",
        root,
        token=client_token,
        env=NO_AUTO_REGISTER,
    )
    backend = AgentProcess(
        f"{cp_b.secure_xds},{cp_a.secure_xds}",
        tmp_path / "b",
        backend_ip,
        "backend",
        "app=backend",
        "--service-account",
        "backend",
        "--ca-root-cert",
        root,
        token=backend_token,
        env=NO_AUTO_REGISTER,
    )
    url = f"http://{client_ip}:9080/"
    results: list[int] = []
    stop = asyncio.Event()

    async def load() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s:
            while not stop.is_set():
                try:
                    async with s.get(url, headers={"Host": "backend"}) as r:
                        await r.read()
                        results.append(r.status)
                except (aiohttp.ClientError, TimeoutError):
                    results.append(0)
                await asyncio.sleep(0.02)

    async def status_rows() -> tuple[int, list[list[str]], str]:
        code, out, err = await ctl("proxy-status", "--xds-address", f"{cp_a.xds},{cp_b.xds}")
        return code, columns(out)[1], err

    try:
        # The first replica creates the CA root in the shared state dir; the second loads it.
        cp_a.start()
        await eventually(lambda: asyncio.to_thread(cp_a.is_ready), timeout=30, what="cp-a")
        cp_b.start()
        await eventually(lambda: asyncio.to_thread(cp_b.is_ready), timeout=30, what="cp-b")
        roots = {(state / "root-cert.pem").read_bytes()}
        assert len(roots) == 1
        client.start()
        backend.start()

        async def ok() -> bool:
            try:
                async with (
                    aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s,
                    s.get(url, headers={"Host": "backend"}) as r,
                ):
                    return bool(r.status == 200)
            except (aiohttp.ClientError, TimeoutError):
                return False

        await eventually(ok, timeout=40, what="client -> backend over mTLS")
        # The client's certificate came from cp-a, the backend's from cp-b: STRICT mTLS
        # worked, so each verified the other's chain to the shared root. The app sees the
        # caller's SPIFFE ID.
        seen = {k.lower(): v for k, v in app.headers_seen[-1].items()}
        xfcc = seen.get("x-forwarded-client-cert", "")
        assert "URI=spiffe://cluster.local/ns/default/sa/client" in xfcc, xfcc

        async def spread() -> list[list[str]] | None:
            code, rows, err = await status_rows()
            assert code == 0, err
            placed = sorted((r[1], r[2]) for r in rows)
            want = sorted([(client_ip, "cp-a"), (backend_ip, "cp-b")])
            return rows if placed == want and all("SYNCED" in r[3:] for r in rows) else None

        await eventually(spread, timeout=20, what="one proxy on each replica")

        loader = asyncio.create_task(load())
        await eventually(lambda: len(results) >= 20, timeout=20, what="load running")
        before_kill = len(results)
        cp_a.kill()

        # The client's agent moves to cp-b; proxy-status (cp-a is gone: exit 1, named on
        # stderr) lists each proxy exactly once, both on cp-b, Envoy SYNCED again.
        async def moved() -> list[list[str]] | None:
            code, rows, err = await status_rows()
            assert code == 1 and cp_a.xds in err, err
            if sorted((r[1], r[2]) for r in rows) != sorted(
                [(client_ip, "cp-b"), (backend_ip, "cp-b")]
            ):
                return None
            client_row = next(r for r in rows if r[1] == client_ip)
            return rows if client_row[3:] == ["SYNCED"] * 5 else None

        rows = await eventually(moved, timeout=30, what="client on cp-b and SYNCED")
        assert len(rows) == 2
        await eventually(
            lambda: len(results) >= before_kill + 50, timeout=20, what="load after failover"
        )
        stop.set()
        await loader
        failed = [s for s in results if s != 200]
        assert not failed, f"{len(failed)} of {len(results)} requests failed"

        code, out, err = await ctl("proxy-status", "--xds-address", cp_b.xds, "-o", "json")
        assert code == 0, err
        assert sorted(d["replica"] for d in json.loads(out)) == ["cp-b", "cp-b"]
    finally:
        stop.set()
        client.kill()
        backend.kill()
        cp_a.kill()
        cp_b.kill()
        await app.close()
