"""Oversized and deeply nested protobufs on every gRPC port: the control plane's plaintext and
TLS ADS, its CA service, and a running agent's XDS and SDS Unix sockets. The attacked call
ends with RESOURCE_EXHAUSTED (gRPC's message size limit) or INVALID_ARGUMENT (protobuf's
nesting limit), never UNKNOWN or INTERNAL from an escaped exception, and the server goes on
serving: another client gets its config (or its secret) afterwards.

The nested messages are built as raw wire bytes (the protobuf library refuses to build them):
node metadata is a `google.protobuf.Struct`, and a Value holding a ListValue holding a Value
nests one level per 4 bytes, past upb's decoding limit of 100."""

from __future__ import annotations

import grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest

from control.app import ControlPlane
from protos import typeurls
from tests.security.common import (
    CA_METHOD,
    ads_status,
    cds_request,
    plain_channel,
    tls_channel,
    token,
)
from tests.security.conftest import RunningAgent
from tests.support.adsclient import node_id
from tests.support.pki import make_csr

CONTROL_PLANE_LIMIT = 64 << 20  # grpc.max_receive_message_length of the control plane ...
AGENT_XDS_LIMIT = 64 << 20  # ... and of the agent's XDS socket
SDS_LIMIT = 4 << 20  # gRPC's default, on the agent's SDS socket
DEPTH = 1000
BIG_SEND = [("grpc.max_send_message_length", 256 << 20)]
SDS_SECRETS = "/envoy.service.secret.v3.SecretDiscoveryService/StreamSecrets"
SDS_FETCH = "/envoy.service.secret.v3.SecretDiscoveryService/FetchSecrets"


# --- hostile messages ------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _nested_struct(depth: int) -> bytes:
    """A Struct {"k": [[[...]]]} nested `depth` Values deep."""
    value = b""
    for _ in range(depth):
        value = _field(6, _field(1, value))  # Value.list_value -> ListValue.values
    return _field(1, _field(1, b"k") + _field(2, value))  # Struct.fields entry


def deep_discovery_request(ip: str = "127.9.0.2", type_url: str = typeurls.CLUSTER) -> bytes:
    """A DiscoveryRequest whose node.metadata (Node field 3) nests DEPTH levels."""
    node = _field(1, node_id(ip, "deep").encode()) + _field(3, _nested_struct(DEPTH))
    return _field(2, node) + _field(4, type_url.encode())


def oversized_discovery_request(limit: int, type_url: str = typeurls.CLUSTER) -> bytes:
    """A well-formed DiscoveryRequest of a proxy the TLS port would accept, just over
    `limit` (its version_info is huge)."""
    req = cds_request(ip="127.9.0.3")
    req.type_url = type_url
    return req.SerializeToString() + _field(1, b"v" * limit)


def deep_certificate_request() -> bytes:
    """IstioCertificateRequest with a good CSR and metadata (field 4) nested DEPTH levels."""
    return _field(1, make_csr()) + _field(4, _nested_struct(DEPTH))


def oversized_certificate_request(limit: int) -> bytes:
    return _field(1, make_csr() + b"\n" * limit)


# --- checks ----------------------------------------------------------------------------------


def _is_size_refusal(code: grpc.StatusCode, details: str) -> bool:
    """The server's own refusal (not the client's send limit: that says 'Sent message')."""
    return code is grpc.StatusCode.RESOURCE_EXHAUSTED and "Received message larger" in details


async def _ads_error(
    channel: grpc.aio.Channel, first: bytes, tok: str | None = None
) -> tuple[grpc.StatusCode, str]:
    call = channel.stream_stream(
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )(metadata=[("authorization", f"Bearer {tok}")] if tok else None, timeout=30)
    try:
        await call.write(first)
        if await call.read() is not grpc.aio.EOF:
            return grpc.StatusCode.OK, "served: the request was accepted"
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""
    finally:
        call.cancel()
    return await call.code(), await call.details()


async def _ca_error(channel: grpc.aio.Channel, raw: bytes, tok: str) -> tuple[grpc.StatusCode, str]:
    method = channel.unary_unary(
        CA_METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    try:
        await method(raw, metadata=[("authorization", f"Bearer {tok}")], timeout=30)
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


async def _control_plane_still_serves(cp: ControlPlane, *, tls: bool) -> None:
    """A well-behaved proxy on a fresh channel gets its clusters (and a CSR signed; on the
    plaintext port, which signs nothing, the CA's refusal shows it still answers)."""
    first = cds_request().SerializeToString()
    if tls:
        async with tls_channel(cp, cp.secure_xds_port) as ch:
            assert await ads_status(ch, first, token(cp)) is grpc.StatusCode.OK
            assert (await _ca_error(ch, _field(1, make_csr()), token(cp)))[0] is grpc.StatusCode.OK
    else:
        async with plain_channel(cp.xds_port) as ch:
            assert await ads_status(ch, first) is grpc.StatusCode.OK
            code, _ = await _ca_error(ch, _field(1, make_csr()), token(cp))
            assert code is grpc.StatusCode.UNAUTHENTICATED


# --- the control plane's ports ---------------------------------------------------------------


async def test_oversized_request_on_plaintext_xds(cp: ControlPlane) -> None:
    async with plain_channel(cp.xds_port, BIG_SEND) as ch:
        code, details = await _ads_error(ch, oversized_discovery_request(CONTROL_PLANE_LIMIT))
    assert _is_size_refusal(code, details), (code, details)
    await _control_plane_still_serves(cp, tls=False)


async def test_deeply_nested_request_on_plaintext_xds(cp: ControlPlane) -> None:
    async with plain_channel(cp.xds_port) as ch:
        code, details = await _ads_error(ch, deep_discovery_request())
    assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    await _control_plane_still_serves(cp, tls=False)


async def test_oversized_request_on_tls_xds(cp: ControlPlane) -> None:
    async with tls_channel(cp, cp.secure_xds_port, BIG_SEND) as ch:
        code, details = await _ads_error(
            ch, oversized_discovery_request(CONTROL_PLANE_LIMIT), token(cp)
        )
    assert _is_size_refusal(code, details), (code, details)
    await _control_plane_still_serves(cp, tls=True)


async def test_deeply_nested_request_on_tls_xds(cp: ControlPlane) -> None:
    async with tls_channel(cp, cp.secure_xds_port) as ch:
        code, details = await _ads_error(ch, deep_discovery_request(), token(cp))
    assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    await _control_plane_still_serves(cp, tls=True)


async def test_oversized_certificate_request(cp: ControlPlane) -> None:
    async with tls_channel(cp, cp.secure_xds_port, BIG_SEND) as ch:
        code, details = await _ca_error(
            ch, oversized_certificate_request(CONTROL_PLANE_LIMIT), token(cp)
        )
    assert _is_size_refusal(code, details), (code, details)
    await _control_plane_still_serves(cp, tls=True)


async def test_deeply_nested_certificate_request(cp: ControlPlane) -> None:
    async with tls_channel(cp, cp.secure_xds_port) as ch:
        code, details = await _ca_error(ch, deep_certificate_request(), token(cp))
    assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    await _control_plane_still_serves(cp, tls=True)


# --- the agent's Unix sockets ----------------------------------------------------------------


async def _agent_xds_still_serves(agent: RunningAgent) -> None:
    async with grpc.aio.insecure_channel(f"unix:{agent.xds_socket}") as ch:
        first = cds_request(ip=agent.process.ip).SerializeToString()
        assert await ads_status(ch, first) is grpc.StatusCode.OK


async def _sds_error(channel: grpc.aio.Channel, raw: bytes) -> tuple[grpc.StatusCode, str]:
    call = channel.stream_stream(
        SDS_SECRETS, request_serializer=lambda b: b, response_deserializer=lambda b: b
    )(timeout=30)
    try:
        await call.write(raw)
        await call.read()
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""
    finally:
        call.cancel()
    return await call.code(), await call.details()


async def _sds_still_serves(agent: RunningAgent) -> None:
    async with grpc.aio.insecure_channel(f"unix:{agent.sds_socket}") as ch:
        fetch = ch.unary_unary(
            SDS_FETCH, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        req = DiscoveryRequest(type_url=typeurls.SECRET, resource_names=["default"])
        assert await fetch(req.SerializeToString(), timeout=15)


async def test_oversized_request_on_agent_xds_socket(agent: RunningAgent) -> None:
    async with grpc.aio.insecure_channel(f"unix:{agent.xds_socket}", options=BIG_SEND) as ch:
        code, details = await _ads_error(ch, oversized_discovery_request(AGENT_XDS_LIMIT))
    assert _is_size_refusal(code, details), (code, details)
    await _agent_xds_still_serves(agent)


async def test_deeply_nested_request_on_agent_xds_socket(agent: RunningAgent) -> None:
    async with grpc.aio.insecure_channel(f"unix:{agent.xds_socket}") as ch:
        code, details = await _ads_error(ch, deep_discovery_request(agent.process.ip))
    assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    await _agent_xds_still_serves(agent)


async def test_oversized_request_on_agent_sds_socket(agent: RunningAgent) -> None:
    async with grpc.aio.insecure_channel(f"unix:{agent.sds_socket}", options=BIG_SEND) as ch:
        code, details = await _sds_error(
            ch, oversized_discovery_request(SDS_LIMIT, typeurls.SECRET)
        )
    assert _is_size_refusal(code, details), (code, details)
    await _sds_still_serves(agent)


async def test_deeply_nested_request_on_agent_sds_socket(agent: RunningAgent) -> None:
    async with grpc.aio.insecure_channel(f"unix:{agent.sds_socket}") as ch:
        code, details = await _sds_error(ch, deep_discovery_request(type_url=typeurls.SECRET))
    assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    await _sds_still_serves(agent)
