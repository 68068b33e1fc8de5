"""Acceptance: a real grpcio `xds:///` client, configured only by the control plane (node
metadata GENERATOR=grpc), reaches a real gRPC backend and follows a WorkloadEntry move.

The client runs in a subprocess: grpc reads GRPC_XDS_BOOTSTRAP once, when the first xds
channel of the process is created, so the test process's own environment must not decide it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from tests.support.controlplane import running_control_plane
from tests.support.net import free_port, pod_ip

BACKEND_PORT = 8080
METHOD = "/test.Echo/Call"
TARGETS = (
    "xds:///echo.default.svc.cluster.local:7070",
    "xds:///echo.default:7070",
    "xds:///echo:7070",  # the short name resolves in the client's namespace
)

# One channel per target for the whole run, calling in a loop: traffic has to move on the
# channels the client already has, as it would in a long-lived application. Prints one JSON
# line per call; exits when stdin closes (the test went away) or after a hard deadline.
CLIENT = textwrap.dedent(
    """
    import json, os, sys, threading, time
    import grpc

    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    deadline = time.monotonic() + float(sys.argv[1])
    calls = [grpc.insecure_channel(t).unary_unary(sys.argv[2]) for t in sys.argv[3:]]
    while time.monotonic() < deadline:
        for target, call in zip(sys.argv[3:], calls):
            try:
                line = {"target": target, "backend": call(b"ping", timeout=2).decode()}
            except grpc.RpcError as e:
                line = {"target": target, "error": e.code().name, "details": e.details()}
            print(json.dumps(line), flush=True)
        time.sleep(0.02)
    """
)


def mesh_yaml(backend_ip: str) -> str:
    return textwrap.dedent(
        f"""
        apiVersion: v1
        kind: Service
        metadata: {{name: echo, namespace: default}}
        spec:
          selector: {{app: echo}}
          ports: [{{name: grpc, port: 7070, targetPort: {BACKEND_PORT}}}]
        ---
        apiVersion: networking.istio.io/v1
        kind: WorkloadEntry
        metadata: {{name: echo-1, namespace: default}}
        spec: {{address: "{backend_ip}", labels: {{app: echo}}}}
        """
    )


class _Echo:
    """Answers METHOD with the backend's name and counts the calls."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0

    async def call(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.calls += 1
        return self.name.encode()


@contextlib.asynccontextmanager
async def backend(name: str, ip: str, port: int = BACKEND_PORT) -> AsyncIterator[_Echo]:
    handler = _Echo(name)
    server = grpc.aio.server()
    service, _, method = METHOD[1:].partition("/")
    # No serializers: requests and responses are raw bytes.
    rpc = grpc.unary_unary_rpc_method_handler(handler.call)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {method: rpc}),))
    assert server.add_insecure_port(f"{ip}:{port}") == port
    await server.start()
    try:
        yield handler
    finally:
        await server.stop(0)


def bootstrap(xds_port: int) -> dict[str, object]:
    return {
        "xds_servers": [
            {
                "server_uri": f"127.0.0.1:{xds_port}",
                "channel_creds": [{"type": "insecure"}],
                "server_features": ["xds_v3"],
            }
        ],
        "node": {
            "id": "sidecar~127.0.0.1~grpcclient.default~default.svc.cluster.local",
            "metadata": {"GENERATOR": "grpc", "NAMESPACE": "default", "AUTO_REGISTER": "false"},
        },
    }


class Client:
    """The subprocess client and the lines it printed so far."""

    def __init__(self, proc: asyncio.subprocess.Process, targets: tuple[str, ...]) -> None:
        self.proc = proc
        self.targets = targets
        self.lines: list[dict[str, str]] = []
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            self.lines.append(json.loads(raw))

    async def wait_for(
        self, want: str, *, timeout: float, settle: int = 5, key: str = "backend"
    ) -> None:
        """Until the last `settle` calls of every target were answered by backend `want` (or,
        with key="error", failed with status code `want`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self._settled(t, key, want, settle) for t in self.targets):
                return
            if self.proc.returncode is not None:
                break
            await asyncio.sleep(0.05)
        recent = self.lines[-2 * len(self.targets) :]
        raise AssertionError(f"traffic did not settle on {want} within {timeout}s: {recent}")

    def _settled(self, target: str, key: str, want: str, settle: int) -> bool:
        mine = [line for line in self.lines if line["target"] == target][-settle:]
        return len(mine) == settle and all(line.get(key) == want for line in mine)

    async def close(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
        await self.proc.wait()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


@contextlib.asynccontextmanager
async def grpc_client(boot: Path, targets: tuple[str, ...] = TARGETS) -> AsyncIterator[Client]:
    env = {**os.environ, "GRPC_XDS_BOOTSTRAP": str(boot)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CLIENT,
        "60",
        METHOD,
        *targets,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    client = Client(proc, targets)
    try:
        yield client
    finally:
        await client.close()


async def test_grpc_client_reaches_backend_and_follows_workload_entry(tmp_path: Path) -> None:
    first_ip, second_ip = pod_ip(), pod_ip()
    cfg = tmp_path / "config"
    cfg.mkdir()
    mesh = cfg / "mesh.yaml"
    mesh.write_text(mesh_yaml(first_ip))
    async with (
        backend("first", first_ip) as first,
        backend("second", second_ip) as second,
        running_control_plane(cfg) as cp,
    ):
        boot = tmp_path / "grpc-bootstrap.json"
        boot.write_text(json.dumps(bootstrap(cp.xds_port)))
        async with grpc_client(boot) as client:
            await client.wait_for("first", timeout=10)
            assert first.calls > 0 and second.calls == 0

            # grpc keeps one XdsClient, hence one ADS stream, per channel target; each stream
            # subscribed to exactly its one listener (never a wildcard) and ACKed every type.
            streams = cp.views.syncz()
            assert len(streams) == len(TARGETS)
            for stream in streams:
                assert stream["proxy"].startswith("sidecar~127.0.0.1~grpcclient.default~")
                assert stream["protocol"] == "sotw", "grpc speaks state-of-the-world"
                rows = {t.rpartition(".")[2]: row for t, row in stream["types"].items()}
                assert {t: row["status"] for t, row in rows.items()} == {
                    "Listener": "SYNCED",
                    "RouteConfiguration": "SYNCED",
                    "Cluster": "SYNCED",
                    "ClusterLoadAssignment": "SYNCED",
                }, rows
                assert {t: row["resources"] for t, row in rows.items()} == dict.fromkeys(rows, 1)

            # The workload moves: the same channels follow the new EDS without a restart.
            mesh.write_text(mesh_yaml(second_ip))
            await client.wait_for("second", timeout=10)
            served = first.calls
            await asyncio.sleep(0.3)
            assert first.calls == served, "nothing reaches the old address any more"

            # The service goes away: grpc learns its listener no longer exists and fails calls
            # (it keeps no stale config). It stays subscribed, so the listener is sent again
            # as soon as the service is back (rule 5), and the same channels recover.
            mesh.write_text("")
            await client.wait_for("UNAVAILABLE", key="error", timeout=10)
            assert "does not exist" in client.lines[-1]["details"]
            mesh.write_text(mesh_yaml(second_ip))
            await client.wait_for("second", timeout=10)
            assert client.proc.returncode is None
            assert not cp.registry.workloads(), "AUTO_REGISTER=false: the client is no workload"


async def test_grpc_client_resolves_a_dns_service_entry(tmp_path: Path) -> None:
    """A DNS ServiceEntry becomes a LOGICAL_DNS cluster, which grpc resolves itself."""
    port = free_port()
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(
        textwrap.dedent(
            f"""
            apiVersion: networking.istio.io/v1
            kind: ServiceEntry
            metadata: {{name: echo-dns, namespace: default}}
            spec:
              hosts: [echo.example.test]
              ports: [{{number: 7070, name: grpc, protocol: GRPC}}]
              resolution: DNS
              endpoints: [{{address: localhost, ports: {{grpc: {port}}}}}]
            """
        )
    )
    target = "xds:///echo.example.test:7070"
    async with backend("dns", "127.0.0.1", port), running_control_plane(cfg) as cp:
        boot = tmp_path / "grpc-bootstrap.json"
        boot.write_text(json.dumps(bootstrap(cp.xds_port)))
        async with grpc_client(boot, (target,)) as client:
            await client.wait_for("dns", timeout=10)
            [stream] = cp.views.syncz()
            assert {row["status"] for row in stream["types"].values()} == {"SYNCED"}
            assert not any(t.endswith("ClusterLoadAssignment") for t in stream["types"]), (
                "a LOGICAL_DNS cluster needs no EDS"
            )


pytestmark = pytest.mark.timeout(60)
