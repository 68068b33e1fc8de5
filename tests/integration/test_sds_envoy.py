"""Real Envoy reading its TLS certificates from the agent's SDS server.

A static bootstrap has the `sds-grpc` cluster on `<dir>/SDS` (as the agent's bootstrap does)
and an mTLS listener whose DownstreamTlsContext takes `default` and `ROOTCA` over SDS. The
secrets come from a SecretManager signing with a real CA (tests/support/testca.py). Checked:
Envoy's admin `/certs` shows the served certificate, a rotation changes the serial without
restarting Envoy, and real TLS clients (Python's ssl, with a client certificate from the CA)
connect before and after the rotation, on a connection kept across it and on new ones."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from agent.envoy.bootstrap import SDS_CLUSTER
from agent.sds.resources import ROOT_CERT, WORKLOAD_CERT
from agent.sds.rotation import RotationPolicy
from agent.sds.secrets import SdsConfig, SecretManager
from agent.sds.server import SdsServer
from tests.support.envoy import EnvoyProcess
from tests.support.net import free_port, pod_ip
from tests.support.testca import TestCA

pytestmark = pytest.mark.envoy

ID = "spiffe://cluster.local/ns/default/sa/default"
_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"
_HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def sds_source() -> dict[str, Any]:
    return {
        "api_config_source": {
            "api_type": "GRPC",
            "transport_api_version": "V3",
            "grpc_services": [{"envoy_grpc": {"cluster_name": SDS_CLUSTER}}],
            # As Istio's generated SDS configs: Envoy's node (tens of KB with its extension
            # list) only on a stream's first request, not on every ACK.
            "set_node_on_first_message_only": True,
        },
        "resource_api_version": "V3",
    }


def mtls_listener(name: str, ip: str, port: int, cert: str, root: str) -> dict[str, Any]:
    """An HTTP listener answering 200 "hi", TLS with certificate and client-CA from SDS."""
    hcm = {
        "@type": f"{_HCM}.HttpConnectionManager",
        "stat_prefix": name,
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/"},
                            "direct_response": {"status": 200, "body": {"inline_string": "hi"}},
                        }
                    ],
                }
            ]
        },
        "http_filters": [
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            }
        ],
    }
    tls = {
        "@type": _TLS,
        "require_client_certificate": True,
        "common_tls_context": {
            "tls_certificate_sds_secret_configs": [{"name": cert, "sds_config": sds_source()}],
            "validation_context_sds_secret_config": {"name": root, "sds_config": sds_source()},
        },
    }
    return {
        "name": name,
        "address": {"socket_address": {"address": ip, "port_value": port}},
        "filter_chains": [
            {
                "filters": [
                    {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                ],
                "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": tls},
            }
        ],
    }


def bootstrap(ip: str, sds_socket: Path, listeners: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "node": {"id": f"sidecar~{ip}~sds.default~default.svc.cluster.local", "cluster": "sds"},
        "admin": {"address": {"socket_address": {"address": ip, "port_value": free_port(ip)}}},
        "static_resources": {
            "clusters": [
                {
                    "name": SDS_CLUSTER,
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": {
                        "cluster_name": SDS_CLUSTER,
                        "endpoints": [
                            {
                                "lb_endpoints": [
                                    {"endpoint": {"address": {"pipe": {"path": str(sds_socket)}}}}
                                ]
                            }
                        ],
                    },
                    "typed_extension_protocol_options": {
                        _HTTP_OPTIONS: {
                            "@type": f"type.googleapis.com/{_HTTP_OPTIONS}",
                            "explicit_http_config": {"http2_protocol_options": {}},
                        }
                    },
                }
            ],
            "listeners": listeners,
        },
    }


@asynccontextmanager
async def running_envoy(boot: dict[str, Any], workdir: Path) -> AsyncIterator[EnvoyProcess]:
    envoy = EnvoyProcess(boot, workdir)
    envoy.start()
    try:
        yield envoy
    finally:
        envoy.stop()


async def cert_serials(envoy: EnvoyProcess) -> list[tuple[list[int], list[int]]]:
    """(cert_chain serials, ca_cert serials) per TLS context, from Envoy's admin /certs."""
    _, text = await envoy.admin_get("/certs")
    out = []
    for c in json.loads(text).get("certificates", []):
        out.append(
            (
                [int(x["serial_number"], 16) for x in c.get("cert_chain", [])],
                [int(x["serial_number"], 16) for x in c.get("ca_cert", [])],
            )
        )
    return out


def client_context(
    ca: TestCA, tmp: Path, stem: str, issuer: TestCA | None = None
) -> ssl.SSLContext:
    """A TLS client trusting `ca`, presenting a certificate issued by `issuer` (default `ca`)."""
    ctx = ssl.create_default_context(cadata=ca.root_pem.decode())
    ctx.check_hostname = False  # mesh certificates name SPIFFE IDs, not hosts
    cert, key = (
        (issuer or ca).client_cert("spiffe://cluster.local/ns/default/sa/client").write(tmp, stem)
    )
    ctx.load_cert_chain(cert, key)
    return ctx


class Conn:
    """One keep-alive HTTP/1.1 connection over TLS."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, ip: str, port: int, ctx: ssl.SSLContext) -> Conn:
        r, w = await asyncio.wait_for(asyncio.open_connection(ip, port, ssl=ctx), 10)
        return cls(r, w)

    @property
    def peer_serial(self) -> int:
        der = self.writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number

    @property
    def peer_uri(self) -> list[str]:
        der = self.writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        san = x509.load_der_x509_certificate(der).extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        )
        return san.value.get_values_for_type(x509.UniformResourceIdentifier)

    async def get(self) -> tuple[int, bytes]:
        self.writer.write(b"GET / HTTP/1.1\r\nHost: mtls\r\n\r\n")
        await self.writer.drain()
        status_line = await asyncio.wait_for(self.reader.readline(), 10)
        length = 0
        while (line := await asyncio.wait_for(self.reader.readline(), 10)) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        body = await asyncio.wait_for(self.reader.readexactly(length), 10)
        return int(status_line.split()[1]), body

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ssl.SSLError, ConnectionError):
            pass


async def test_envoy_serves_and_rotates_the_workload_certificate(tmp_path: Path) -> None:
    ip, port = pod_ip(), 15443
    ca = TestCA()
    # A few seconds of lifetime: the manager renews at about half of it.
    cfg = SdsConfig(cert_ttl=8, rotation=RotationPolicy(min_delay=0.5, retry_initial=0.2))
    sock = tmp_path / "SDS"
    async with SecretManager(ca, cfg) as manager, SdsServer(sock, manager) as server:
        boot = bootstrap(ip, sock, [mtls_listener("mtls", ip, port, WORKLOAD_CERT, ROOT_CERT)])
        async with running_envoy(boot, tmp_path / "envoy") as envoy:
            # The listener warms until both secrets arrive over SDS.
            await envoy.wait_for(
                lambda: _listener_active(envoy), timeout=30, what="mTLS listener active"
            )
            pid = envoy.proc.pid if envoy.proc else None
            certs = await cert_serials(envoy)
            assert len(certs) == 1
            (chain, roots) = certs[0]
            assert roots == [ca.root.serial_number]
            # The leaf alone (the root is not in the chain), one the CA issued.
            assert len(chain) == 1 and chain[0] in ca.issued
            first = chain[0]

            ctx = client_context(ca, tmp_path, "client")
            kept = await Conn.open(ip, port, ctx)
            assert await kept.get() == (200, b"hi")
            assert kept.peer_serial == first
            assert kept.peer_uri == [ID]

            # Rotation: Envoy's serial changes, Envoy is the same process.
            async def rotated() -> bool:
                return (await cert_serials(envoy))[0][0][0] != first

            await envoy.wait_for(rotated, timeout=30, what="serial change after rotation")
            assert envoy.proc is not None and envoy.proc.poll() is None
            assert envoy.proc.pid == pid
            assert manager.stats.rotations >= 1
            assert server.active >= 1  # Envoy's SDS stream(s) stayed up

            # The connection made before the rotation still works ...
            assert await kept.get() == (200, b"hi")
            await kept.close()
            # ... and new connections get the new certificate.
            fresh = await Conn.open(ip, port, ctx)
            assert await fresh.get() == (200, b"hi")
            assert fresh.peer_serial != first
            assert fresh.peer_serial in ca.issued
            await fresh.close()

            # ROOTCA is enforced: a client certificate from another CA is refused.
            stranger = client_context(ca, tmp_path, "stranger", issuer=TestCA(name="other"))
            with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
                conn = await Conn.open(ip, port, stranger)
                await conn.get()

            # Envoy took every update it was sent (first certificate and rotations).
            assert await envoy.stat("sds.default.update_rejected") == 0
            assert (await envoy.stat("sds.default.update_success") or 0) >= 2


async def test_envoy_reads_file_mounted_certificates(tmp_path: Path) -> None:
    ip, port = pod_ip(), 15443
    ca = TestCA()
    certs_dir = tmp_path / "certs"
    certs_dir.mkdir()
    cert, key = ca.client_cert(ID).write(certs_dir, "cert-chain")
    root = certs_dir / "root-cert.pem"
    root.write_bytes(ca.root_pem)
    cert_name, root_name = f"file-cert:{cert}~{key}", f"file-root:{root}"
    cfg = SdsConfig(file_poll_interval=0.1)
    sock = tmp_path / "SDS"
    async with SecretManager(ca, cfg) as manager, SdsServer(sock, manager):
        boot = bootstrap(ip, sock, [mtls_listener("files", ip, port, cert_name, root_name)])
        async with running_envoy(boot, tmp_path / "envoy") as envoy:
            await envoy.wait_for(lambda: _listener_active(envoy), timeout=30, what="listener")
            ctx = client_context(ca, tmp_path, "client")
            conn = await Conn.open(ip, port, ctx)
            assert await conn.get() == (200, b"hi")
            assert conn.peer_serial == ca.issued[0]
            await conn.close()

            # The files are replaced: Envoy gets the new certificate, no restart.
            newer = ca.client_cert(ID)
            newer.write(certs_dir, "cert-chain")

            async def serves_newer() -> bool:
                c = await Conn.open(ip, port, ctx)
                try:
                    return c.peer_serial == newer.serial
                finally:
                    await c.close()

            await envoy.wait_for(serves_newer, timeout=30, what="file-cert pushed to Envoy")


async def _listener_active(envoy: EnvoyProcess) -> bool:
    # Active (warmed) is not yet accepting: Envoy starts its workers after the first listeners
    # warm, and until then a connection is refused.
    if (await envoy.stat("listener_manager.total_listeners_active")) != 1:
        return False
    return (await envoy.stat("listener_manager.workers_started")) == 1
