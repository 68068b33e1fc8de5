"""The control plane's own TLS certificates are renewed at half their lifetime, for real: new
handshakes on the TLS gRPC port, the client-certificate port and the injection webhook get
the new certificate, a gRPC channel opened before the renewal keeps working, and every
certificate chains to the mesh root."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from control.app import ControlPlane, ControlPlaneOptions
from control.ca.identity import Identity
from protos import ca_pb2, ca_pb2_grpc
from tests.support.controlplane import eventually
from tests.support.pki import make_csr

LIFETIME = 3.0  # seconds: renewed every 1.5 s


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    (tmp_path / "mesh.yaml").write_text("")
    opts = ControlPlaneOptions(
        config_paths=(str(tmp_path / "mesh.yaml"),),
        xds_address="127.0.0.1:0",
        secure_xds_address="127.0.0.1:0",
        mtls_xds_address="127.0.0.1:0",
        webhook_address="127.0.0.1:0",
        http_address="127.0.0.1:0",
        serving_cert_ttl=LIFETIME,
    )
    async with ControlPlane(opts) as cp:
        yield cp


def presented(cp: ControlPlane, port: int, alpn: str) -> x509.Certificate:
    """The certificate a new TLS handshake gets, verified against the mesh root for the name
    `localhost` (blocking: run in a thread)."""
    assert cp.ca is not None
    ctx = ssl.create_default_context(cadata=cp.ca.root_pem)
    ctx.set_alpn_protocols([alpn])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


async def serials(cp: ControlPlane) -> tuple[int, int, int]:
    """The serials the three ports present, read while no renewal happened: a renewal every
    1.5 s can fall between two of the three handshakes on a loaded machine, and the
    comparison with `current` would then be between two different moments."""
    assert cp.serving is not None and cp.webhook_serving is not None
    for _ in range(20):
        before = (cp.serving.renewals, cp.webhook_serving.renewals)
        grpc_cert = await asyncio.to_thread(presented, cp, cp.secure_xds_port, "h2")
        mtls_cert = await asyncio.to_thread(presented, cp, cp.mtls_xds_port, "h2")
        webhook_cert = await asyncio.to_thread(presented, cp, cp.webhook_port, "http/1.1")
        if before == (cp.serving.renewals, cp.webhook_serving.renewals):
            break
    return grpc_cert.serial_number, mtls_cert.serial_number, webhook_cert.serial_number


async def sign(channel: grpc.aio.Channel, cp: ControlPlane) -> None:
    assert cp.tokens is not None
    token = cp.tokens.issue(Identity("default", "sleep"), 600, time.time())
    resp = await ca_pb2_grpc.IstioCertificateServiceStub(channel).CreateCertificate(
        ca_pb2.IstioCertificateRequest(csr=make_csr().decode(), validity_duration=600),
        metadata=[("authorization", f"Bearer {token}")],
    )
    assert len(resp.cert_chain) >= 2


async def test_new_handshakes_get_the_renewed_certificate(cp: ControlPlane) -> None:
    assert cp.ca is not None and cp.serving is not None and cp.webhook_serving is not None
    first = await serials(cp)
    assert first[0] == first[1] == cp.serving.current.serial
    assert first[2] == cp.webhook_serving.current.serial
    root = cp.ca.root_pem.encode()
    creds = grpc.ssl_channel_credentials(root_certificates=root)
    async with grpc.aio.secure_channel(f"127.0.0.1:{cp.secure_xds_port}", creds) as before:
        await sign(before, cp)
        await eventually(
            lambda: cp.serving is not None and cp.serving.renewals >= 2,
            timeout=10,
            what="two renewals",
        )
        # The connection set up with the first certificate is still good...
        await sign(before, cp)
    later = await serials(cp)
    # ... and every port hands the renewed one to new handshakes.
    assert later[0] == later[1] == cp.serving.current.serial
    assert later[2] == cp.webhook_serving.current.serial
    assert set(later).isdisjoint(first)
    async with grpc.aio.secure_channel(f"127.0.0.1:{cp.secure_xds_port}", creds) as after:
        await sign(after, cp)
