"""Proxyless mTLS end to end, with real grpcio on both sides: a client calling
`xds:///echo...` with `grpc.xds_channel_credentials` and an xDS-enabled server
(`grpc.server(..., xds=True)` with `grpc.xds_server_credentials`), each beside its own
`pilotfish-agent --proxy-only`, configured only by the control plane and the bootstrap and
certificate files their agents write.

- STRICT: the server sees the client's SPIFFE ID in the peer's certificate (auth context), and
  a plaintext client calling the server directly is refused;
- PERMISSIVE (no tlsMode label): plaintext to the server works, and mesh clients use it too
  (a gRPC server cannot serve TLS and plaintext on one port);
- rotation: with 6-second certificates the files are rewritten again and again, and calls on
  channels made afresh (a TLS handshake each) keep working with the new certificates.

Client and server run in subprocesses: grpc reads GRPC_XDS_BOOTSTRAP once per process. The
server is grpcio's synchronous server because `grpc.aio.server` has no `xds` option (its
Cython core hard-codes xDS off).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import grpc
from cryptography import x509

from tests.support.controlplane import eventually, running_control_plane
from tests.support.mesh import mesh_agent
from tests.support.net import pod_ip
from tests.support.proxyless import (
    CLIENT,
    ECHO_HOST,
    MESH,
    METHOD,
    PORT,
    SERVER,
    TARGET,
    agent,
    echo_and_caller,
    peer_authentication,
    python,
    settled,
)


async def plaintext_call(ip: str) -> str:
    """A call straight to the server without TLS: the answer's security, or the error code."""
    async with grpc.aio.insecure_channel(f"{ip}:{PORT}") as channel:
        try:
            answer = json.loads(await channel.unary_unary(METHOD)(b"", timeout=3))
        except grpc.aio.AioRpcError as e:
            return e.code().name
    return "ok:" + ",".join(answer["security"])


def serial_of(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


async def test_strict_permissive_and_plaintext(tmp_path: Path) -> None:
    server_ip, client_ip = pod_ip(), pod_ip()
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    policy = cfg / "peer.yaml"
    policy.write_text(peer_authentication("STRICT"))
    async with running_control_plane(cfg) as cp:
        async with (
            echo_and_caller(cp, tmp_path, server_ip, client_ip),
            python(
                SERVER,
                tmp_path / "server" / "grpc-bootstrap.json",
                f"{server_ip}:{PORT}",
                METHOD,
            ),
            python(
                CLIENT, tmp_path / "client" / "grpc-bootstrap.json", TARGET, METHOD, "reuse"
            ) as client,
        ):
            caller = "spiffe://cluster.local/ns/default/sa/caller"
            await settled(client, lambda c: caller in c.get("sans", ()), timeout=30)
            assert client.calls()[-1]["security"] == ["tls"]
            # Plaintext straight to the server: refused under STRICT (no TLS handshake).
            assert await plaintext_call(server_ip) == "UNAVAILABLE"

            # PERMISSIVE: the server's port turns plaintext; so do mesh clients towards it.
            policy.write_text(peer_authentication("PERMISSIVE"))
            await settled(client, lambda c: c.get("security") == ["insecure"], timeout=30)
            assert await eventually(
                lambda: plaintext_call(server_ip), timeout=15, what="plaintext accepted"
            ) in ("ok:insecure",)

            # And back: STRICT again refuses plaintext, mesh calls are mTLS again.
            policy.write_text(peer_authentication("STRICT"))
            await settled(client, lambda c: caller in c.get("sans", ()), timeout=30)
            assert await plaintext_call(server_ip) == "UNAVAILABLE"


async def test_rotation_rewrites_files_and_calls_keep_working(tmp_path: Path) -> None:
    server_ip, client_ip = pod_ip(), pod_ip()
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    (cfg / "peer.yaml").write_text(peer_authentication("STRICT"))
    ttl = ("--workload-cert-ttl", "6")
    async with running_control_plane(cfg) as cp:
        async with (
            echo_and_caller(cp, tmp_path, server_ip, client_ip, *ttl),
            python(
                SERVER,
                tmp_path / "server" / "grpc-bootstrap.json",
                f"{server_ip}:{PORT}",
                METHOD,
            ),
            python(
                CLIENT, tmp_path / "client" / "grpc-bootstrap.json", TARGET, METHOD, "fresh"
            ) as client,
        ):
            boot = json.loads((tmp_path / "client" / "grpc-bootstrap.json").read_text())
            provider = boot["certificate_providers"]["default"]["config"]
            assert provider["refresh_interval"] == "1s"
            chain = Path(provider["certificate_file"])
            key = Path(provider["private_key_file"])
            assert key.stat().st_mode & 0o777 == 0o600
            await settled(client, lambda c: "serial" in c and c["serial"], timeout=30)
            start = len(client.calls())
            seen_files: set[int] = set()
            server_chain = tmp_path / "server" / "certs" / "cert-chain.pem"
            seen_server: set[int] = set()
            # Three certificate lifetimes: every certificate in use at the start has expired
            # by the end, so the handshakes at the end used rotated ones.
            deadline = time.monotonic() + 18
            while time.monotonic() < deadline:
                seen_files.add(serial_of(chain))
                seen_server.add(serial_of(server_chain))
                await asyncio.sleep(0.5)
            calls = client.calls()[start:]
            failed = [c for c in calls if "error" in c]
            assert not failed, failed[:3]
            assert len(seen_files) >= 3 and len(seen_server) >= 3
            # The server saw the client present certificates the agent wrote during the run.
            presented = {int(str(c["serial"]), 16) for c in calls}
            assert len(presented & seen_files) >= 3
            assert key.stat().st_mode & 0o777 == 0o600


async def test_envoy_sidecar_client_calls_a_strict_proxyless_server(tmp_path: Path) -> None:
    """Auto mTLS from an Envoy sidecar to a proxyless server: the server's endpoint is mTLS
    under STRICT, Envoy originates ISTIO_MUTUAL (offering h2 among its ALPN protocols, which
    gRPC's TLS requires), and the server sees the sidecar's identity."""
    server_ip, client_ip = pod_ip(), pod_ip()
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    (cfg / "peer.yaml").write_text(peer_authentication("STRICT"))
    async with running_control_plane(cfg) as cp:
        sidecar = mesh_agent(
            cp,
            tmp_path,
            client_ip,
            "envoy-caller-1",
            "app=envoy-caller",
            "--dns-port",
            "0",
            service_account="envoy-caller",
            workdir=tmp_path / "envoy-caller",
        )
        sidecar.start()
        try:
            async with (
                agent(
                    cp,
                    tmp_path / "server",
                    server_ip,
                    "echo-1",
                    "app=echo",
                    service_account="echo",
                    group="echo",
                ),
                python(
                    SERVER,
                    tmp_path / "server" / "grpc-bootstrap.json",
                    f"{server_ip}:{PORT}",
                    METHOD,
                ),
            ):

                async def call() -> dict[str, object] | None:
                    # The app beside the sidecar: plaintext to its Envoy's outbound listener.
                    options = [("grpc.default_authority", f"{ECHO_HOST}:7070")]
                    async with grpc.aio.insecure_channel(
                        f"{client_ip}:7070", options=options
                    ) as channel:
                        try:
                            raw = await channel.unary_unary(METHOD)(b"", timeout=3)
                        except grpc.aio.AioRpcError:
                            return None
                    answer: dict[str, object] = json.loads(raw)
                    return answer

                answer = await eventually(call, timeout=40, what="call through the sidecar")
                assert "spiffe://cluster.local/ns/default/sa/envoy-caller" in answer["sans"]
                assert answer["security"] == ["tls"]
        finally:
            assert sidecar.terminate() == 0, sidecar.log()[-3000:]
