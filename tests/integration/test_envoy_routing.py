"""Acceptance: real Envoy over SotW and delta ADS routes by Host and follows YAML changes."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import aiohttp
import pytest

from agent.envoy.bootstrap import BootstrapOptions, build_bootstrap
from protos import typeurls
from tests.support.apps import EchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.envoy import EnvoyProcess
from tests.support.net import pod_ip

pytestmark = pytest.mark.envoy


def mesh_yaml(alpha_ip: str, beta_ip: str, *, with_gamma: bool = False, gamma_ip: str = "") -> str:
    docs = [
        f"""
        apiVersion: v1
        kind: Service
        metadata: {{name: alpha, namespace: default}}
        spec:
          selector: {{app: alpha}}
          ports: [{{name: http, port: 9080, targetPort: 8080}}]
        ---
        apiVersion: v1
        kind: Service
        metadata: {{name: beta, namespace: default}}
        spec:
          selector: {{app: beta}}
          ports: [{{name: http, port: 9080, targetPort: 8080}}]
        ---
        apiVersion: networking.istio.io/v1
        kind: WorkloadEntry
        metadata: {{name: alpha-1, namespace: default}}
        spec: {{address: "{alpha_ip}", labels: {{app: alpha}}}}
        ---
        apiVersion: networking.istio.io/v1
        kind: WorkloadEntry
        metadata: {{name: beta-1, namespace: default}}
        spec: {{address: "{beta_ip}", labels: {{app: beta}}}}
        """
    ]
    if with_gamma:
        docs.append(
            f"""
        ---
        apiVersion: v1
        kind: Service
        metadata: {{name: gamma, namespace: default}}
        spec:
          selector: {{app: gamma}}
          ports: [{{name: http, port: 9080, targetPort: 8080}}]
        ---
        apiVersion: networking.istio.io/v1
        kind: WorkloadEntry
        metadata: {{name: gamma-1, namespace: default}}
        spec: {{address: "{gamma_ip}", labels: {{app: gamma}}}}
        """
        )
    return textwrap.dedent("".join(docs))


async def started_apps(*apps: tuple[str, str]) -> list[EchoApp]:
    """Echo apps (name, pod IP) on port 8080, started."""
    started = [EchoApp(name, ip, 8080) for name, ip in apps]
    for a in started:
        await a.start()
    return started


def mesh_file(tmp_path: Path, text: str) -> Path:
    """The mesh YAML in a config directory of its own (what the control plane watches)."""
    cfg = tmp_path / "config"
    cfg.mkdir()
    mesh = cfg / "mesh.yaml"
    mesh.write_text(text)
    return mesh


def client_envoy(
    xds_port: int, client_ip: str, workdir: Path, *, delta: bool = False
) -> EnvoyProcess:
    """A started Envoy for the client pod, on ADS to the control plane's plaintext port."""
    boot = build_bootstrap(
        BootstrapOptions(
            ip=client_ip,
            pod_name="client",
            labels={"app": "client"},
            xds_address=f"127.0.0.1:{xds_port}",
            delta=delta,
        )
    )
    envoy = EnvoyProcess(boot, workdir)
    envoy.start()
    return envoy


async def get_app(client_ip: str, host: str) -> tuple[int, str]:
    """One request through the client's outbound listener; returns (status, app name)."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s,
            s.get(f"http://{client_ip}:9080/hello", headers={"Host": host}) as r,
        ):
            text = await r.text()
            if r.status != 200:
                return r.status, ""
            return r.status, json.loads(text)["app"]
    except (aiohttp.ClientError, TimeoutError):
        return 0, ""


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_envoy_routes_by_host_and_follows_config(tmp_path: Path, delta: bool) -> None:
    alpha_ip, beta_ip, gamma_ip, client_ip = pod_ip(), pod_ip(), pod_ip(), pod_ip()
    apps = await started_apps(("alpha", alpha_ip), ("beta", beta_ip), ("gamma", gamma_ip))
    mesh = mesh_file(tmp_path, mesh_yaml(alpha_ip, beta_ip))
    async with running_control_plane(mesh.parent) as cp:
        envoy = client_envoy(cp.xds_port, client_ip, tmp_path / "envoy", delta=delta)
        try:
            # Every name a client may use reaches the right backend.
            for host, want in (
                ("alpha", "alpha"),
                ("alpha.default", "alpha"),
                ("alpha.default.svc", "alpha"),
                ("alpha.default.svc.cluster.local", "alpha"),
                ("alpha.default.svc.cluster.local:9080", "alpha"),
                ("beta:9080", "beta"),
                ("beta.default.svc.cluster.local", "beta"),
            ):
                got = await eventually(
                    lambda h=host: _ok(get_app(client_ip, h)), timeout=20, what=f"route {host}"
                )
                assert got == want, host
            status, _ = await get_app(client_ip, "gamma")
            assert status == 404  # not configured yet

            # A service added and a WorkloadEntry removed: traffic follows without restarts.
            text = mesh_yaml(alpha_ip, beta_ip, with_gamma=True, gamma_ip=gamma_ip)
            text = text.replace(
                f'spec: {{address: "{beta_ip}", labels: {{app: beta}}}}',
                'spec: {address: "127.0.0.1", labels: {app: gone}}',
            )
            mesh.write_text(text)
            assert (
                await eventually(
                    lambda: _ok(get_app(client_ip, "gamma")), timeout=5, what="gamma routed"
                )
                == "gamma"
            )
            await eventually(
                lambda: _status(get_app(client_ip, "beta"), 503), timeout=5, what="beta drained"
            )
            assert (await get_app(client_ip, "alpha"))[1] == "alpha"
            assert envoy.proc is not None and envoy.proc.poll() is None
            syncz = cp.views.syncz()
            assert len(syncz) == 1 and syncz[0]["protocol"] == ("delta" if delta else "sotw")
        finally:
            envoy.stop()
    for a in apps:
        await a.close()


async def _ok(call: object) -> str:
    status, app = await call  # type: ignore[misc]
    return app if status == 200 else ""


async def _status(call: object, want: int) -> bool:
    status, _ = await call  # type: ignore[misc]
    return bool(status == want)


async def test_envoy_keeps_the_assignments_a_sotw_endpoint_push_leaves_out(tmp_path: Path) -> None:
    """An endpoint move over SotW sends Envoy only the assignment that changed (Envoy updates
    the clusters a response names); every other cluster keeps routing to its endpoints."""
    alpha_ip, beta_ip, moved_ip, client_ip = pod_ip(), pod_ip(), pod_ip(), pod_ip()
    apps = await started_apps(("alpha", alpha_ip), ("beta", beta_ip), ("alpha-moved", moved_ip))
    mesh = mesh_file(tmp_path, mesh_yaml(alpha_ip, beta_ip))
    alpha_cluster = "cluster.outbound|9080||alpha.default.svc.cluster.local"
    beta_cluster = "cluster.outbound|9080||beta.default.svc.cluster.local"
    async with running_control_plane(mesh.parent) as cp:
        envoy = client_envoy(cp.xds_port, client_ip, tmp_path / "envoy")
        try:
            for host in ("alpha", "beta"):
                got = await eventually(
                    lambda h=host: _ok(get_app(client_ip, h)), timeout=20, what=f"route {host}"
                )
                assert got == host
            beta_updates = await envoy.stat(f"{beta_cluster}.update_attempt")
            alpha_updates = await envoy.stat(f"{alpha_cluster}.update_attempt")
            assert beta_updates is not None and alpha_updates is not None
            on_bytes = cp.xds.acks_on_bytes

            mesh.write_text(mesh_yaml(alpha_ip, beta_ip).replace(f'"{alpha_ip}"', f'"{moved_ip}"'))
            got = await eventually(
                lambda: _app_is(get_app(client_ip, "alpha"), "alpha-moved"),
                timeout=10,
                what="alpha moved",
            )
            assert got == "alpha-moved"
            assert (await get_app(client_ip, "beta"))[1] == "beta"
            # The push named alpha's assignment only: beta's EDS watch was not even called.
            assert (await envoy.stat(f"{alpha_cluster}.update_attempt") or 0) > alpha_updates
            assert await envoy.stat(f"{beta_cluster}.update_attempt") == beta_updates

            # Envoy routes by the new assignment before its ACK reaches the control plane: on
            # a loaded machine the row may read STALE for a moment first.
            async def synced() -> dict[str, object] | None:
                (row,) = cp.views.syncz()
                eds: dict[str, object] = row["types"][typeurls.ENDPOINT]
                return eds if (eds["status"], eds["resources"]) == ("SYNCED", 2) else None

            await eventually(synced, timeout=10, what="EDS acked")
            # Envoy's ACK of the push (its fields in number order, no node after the first
            # request) was recognised on its bytes, not decoded (SotwStream.decode_unchanged).
            assert cp.xds.acks_on_bytes > on_bytes
        finally:
            envoy.stop()
    for a in apps:
        await a.close()


async def _app_is(call: object, want: str) -> str | None:
    _, app = await call  # type: ignore[misc]
    return app if app == want else None
