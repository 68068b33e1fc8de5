"""What the attacks share: a control plane on ephemeral ports (plaintext, TLS and mTLS gRPC
ports, real certificates from its own CA), channels to it, and calls that report the status a
real server answered with (so that no test passes because nothing was reached)."""

from __future__ import annotations

import asyncio
import time

import grpc
from cryptography import x509
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest

from control.app import ControlPlane
from control.ca.identity import Identity
from protos import ca_pb2, ca_pb2_grpc, typeurls
from tests.support.adsclient import SOTW, node_id
from tests.support.pki import load_chain, make_csr
from tests.support.traffic import service

MESH = service("alpha", "alpha")

SLEEP = Identity("default", "sleep")
CA_METHOD = "/istio.v1.auth.IstioCertificateService/CreateCertificate"


def token(cp: ControlPlane, identity: Identity = SLEEP, ttl: float = 3600) -> str:
    assert cp.tokens is not None
    return cp.tokens.issue(identity, ttl, time.time())


def root_pem(cp: ControlPlane) -> bytes:
    assert cp.ca is not None
    return cp.ca.root_pem.encode()


def tls_channel(
    cp: ControlPlane, port: int, options: list[tuple[str, int]] | None = None, **kw: bytes
) -> grpc.aio.Channel:
    """A TLS channel that trusts only this control plane's root (as an agent does)."""
    return grpc.aio.secure_channel(
        f"127.0.0.1:{port}",
        grpc.ssl_channel_credentials(root_certificates=root_pem(cp), **kw),
        options=options,
    )


def plain_channel(port: int, options: list[tuple[str, int]] | None = None) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options)


async def create_cert(
    channel: grpc.aio.Channel, csr: bytes, tok: str | None, ttl: int = 600
) -> list[x509.Certificate]:
    stub = ca_pb2_grpc.IstioCertificateServiceStub(channel)
    md = [("authorization", f"Bearer {tok}")] if tok else []
    resp = await stub.CreateCertificate(
        ca_pb2.IstioCertificateRequest(csr=csr.decode(), validity_duration=ttl),
        metadata=md,
        timeout=20,
    )
    return load_chain(list(resp.cert_chain))


async def ca_status(channel: grpc.aio.Channel, tok: str | None) -> grpc.StatusCode:
    """The status CreateCertificate answers with a good CSR and this token (OK when signed)."""
    try:
        await create_cert(channel, make_csr(), tok)
    except grpc.aio.AioRpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def cds_request(identity: Identity = SLEEP, ip: str = "127.9.0.1") -> DiscoveryRequest:
    """A first SotW request of a proxy claiming `identity` (what check_claim compares)."""
    r = DiscoveryRequest(type_url=typeurls.CLUSTER)
    r.node.id = node_id(ip, "p", identity.namespace)
    r.node.metadata.update(
        {"NAMESPACE": identity.namespace, "SERVICE_ACCOUNT": identity.service_account}
    )
    return r


async def ads_status(
    channel: grpc.aio.Channel,
    first: bytes,
    tok: str | None = None,
    timeout: float = 10.0,
) -> grpc.StatusCode:
    """Open a SotW ADS stream, send `first` (raw bytes) and report the outcome: OK when a
    response came back, otherwise the status the server ended the stream with."""
    call = channel.stream_stream(
        SOTW, request_serializer=lambda b: b, response_deserializer=lambda b: b
    )(metadata=[("authorization", f"Bearer {tok}")] if tok else None)
    try:
        await call.write(first)
        async with asyncio.timeout(timeout):
            resp = await call.read()
        if resp is grpc.aio.EOF:
            return await call.code()
        return grpc.StatusCode.OK
    except grpc.aio.AioRpcError as e:
        return e.code()
    finally:
        call.cancel()
