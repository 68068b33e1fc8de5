"""An ACK whose names did not change is decoded without them (issue 23, target 5): counted
in full decodes and varint-reader calls, never timed; the fan-out benchmark times it.

Decoding makes a string of every resource name, and a SotW EDS ACK names every cluster the
proxy uses; a push to a thousand streams brings a thousand such ACKs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest
from envoy.config.core.v3.base_pb2 import Node
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest
from google.rpc.status_pb2 import Status

from control.metrics import Metrics
from control.model.proxy import Proxy, proxy_from_node
from control.xds import server as server_module
from control.xds.cache import ResourceSet
from control.xds.connection import Connection
from control.xds.server import XdsServer
from control.xds.sotw import SotwStream
from control.xds.state import RequestKind
from protos import typeurls, wire

EDS = typeurls.ENDPOINT
SDS = typeurls.SECRET
NAMES = [f"outbound|9080||svc-{i}.default.svc.cluster.local" for i in range(200)]
NODE = Node(id="sidecar~10.0.0.1~a.default~default.svc.cluster.local")


class _Source:
    def resources(self, proxy: Proxy, type_urls: Iterable[str]) -> dict[str, ResourceSet]:
        return {t: ResourceSet(()) for t in type_urls}

    def push_started_at(self) -> float:
        return 0.0


def _raw(**fields: object) -> bytes:
    return DiscoveryRequest(**fields).SerializeToString()  # type: ignore[arg-type]


def _envoy_ack(nonce: str, names: list[str] = NAMES, type_url: str = EDS, **more: object) -> bytes:
    """As Envoy lays an ACK out: fields in number order, the names between them."""
    return _raw(
        version_info="v", resource_names=names, type_url=type_url, response_nonce=nonce, **more
    )


def _appended_ack(nonce: str, names: list[str] = NAMES) -> bytes:
    """As the load tool lays it out: the names appended after the other fields."""
    return _raw(version_info="v", type_url=EDS, response_nonce=nonce) + wire.request_names(names)


def _stream(
    guards: dict[str, Callable[..., None]] | None = None, type_url: str = EDS
) -> tuple[XdsServer, Connection]:
    """A server with one SotW stream subscribed to NAMES of `type_url`, sent one response."""
    srv = XdsServer(_Source(), Metrics(), guards=guards)  # type: ignore[arg-type]
    first = _raw(node=NODE, resource_names=NAMES, type_url=type_url)
    req = DiscoveryRequest.FromString(first)
    conn = Connection("c-1", proxy_from_node(NODE.id, {}), False, SotwStream("c-1"), 0.0)
    srv._handle_request(conn, req, first)
    srv._collect(conn)
    return srv, conn


def _nonce(conn: Connection) -> str:
    """The nonce of the last response on the stream's one type."""
    (row,) = conn.state.status()
    return row.sent_nonce


def _count_full_decodes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    decoded: list[bytes] = []
    real = server_module.decode_request

    def counted(raw: bytes, delta: bool) -> object:
        decoded.append(raw)
        return real(raw, delta)

    monkeypatch.setattr(server_module, "decode_request", counted)
    return decoded


def _count_varint_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    reads: list[int] = []
    real = wire._read_varint

    def counted(data: bytes, i: int) -> tuple[int, int]:
        reads.append(i)
        return real(data, i)

    monkeypatch.setattr(wire, "_read_varint", counted)
    return reads


@pytest.mark.parametrize("layout", [_envoy_ack, _appended_ack])
def test_an_unchanged_ack_is_decoded_without_its_names(
    monkeypatch: pytest.MonkeyPatch, layout: Callable[[str], bytes]
) -> None:
    srv, conn = _stream()
    decoded = _count_full_decodes(monkeypatch)
    reads = _count_varint_reads(monkeypatch)
    for _ in range(3):
        nonce = _nonce(conn)
        srv._read(conn, layout(nonce))
        (row,) = conn.state.status()
        assert row.acked_nonce == nonce and row.status == "SYNCED"
        assert not conn.respond_types
    assert srv.acks == 3
    assert decoded == []  # never the whole request
    assert reads == []  # every field of these ACKs is read on the one-byte path
    assert conn.state.subscription(EDS) == (False, frozenset(NAMES))


def test_what_is_not_an_unchanged_ack_is_decoded_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    srv, conn = _stream()
    decoded = _count_full_decodes(monkeypatch)
    # One more name: decoded whole, subscribed and answered.
    srv._read(conn, _envoy_ack(_nonce(conn), [*NAMES, "new"]))
    assert len(decoded) == 1 and "new" in conn.state.subscription(EDS)[1]
    assert conn.respond_types == {EDS}
    srv._collect(conn)
    # Back to NAMES: the bytes no longer match the last request's, decoded whole again.
    srv._read(conn, _envoy_ack(_nonce(conn)))
    assert len(decoded) == 2 and "new" not in conn.state.subscription(EDS)[1]
    # Names split around another field: not comparable on the bytes.
    split = _raw(resource_names=NAMES[:10], type_url=EDS) + _raw(
        response_nonce=_nonce(conn), resource_names=NAMES[10:]
    )
    srv._read(conn, split)
    assert len(decoded) == 3 and conn.state.subscription(EDS)[1] == frozenset(NAMES)


def test_a_nack_with_unchanged_names_is_still_a_nack(monkeypatch: pytest.MonkeyPatch) -> None:
    srv, conn = _stream()
    decoded = _count_full_decodes(monkeypatch)
    nonce = _nonce(conn)
    srv._read(conn, _envoy_ack(nonce, error_detail=Status(code=3, message="bad"), node=NODE))
    assert decoded == []
    (row,) = conn.state.status()
    assert row.status == "ERROR" and row.last_nack == "bad"
    assert conn.state.subscription(EDS) == (False, frozenset(NAMES))
    # A stale nonce is still stale.
    srv._read(conn, _envoy_ack("not-sent"))
    assert decoded == [] and conn.state.status()[0].status == "ERROR"


def test_a_guarded_type_is_decoded_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    srv, conn = _stream({SDS: lambda proxy, identity, names: seen.append(list(names))}, SDS)
    decoded = _count_full_decodes(monkeypatch)
    srv._read(conn, _envoy_ack(_nonce(conn), type_url=SDS))
    # The guard judges the names themselves, so it gets them all, every time.
    assert len(decoded) == 1 and seen[-1] == NAMES


def test_same_names_needs_names_seen_on_the_bytes() -> None:
    s = SotwStream("s")
    slim = DiscoveryRequest(type_url=EDS, response_nonce="1")
    with pytest.raises(ValueError, match="same_names"):
        s.receive(slim, same_names=True)
    raw = _raw(type_url=EDS, resource_names=NAMES)
    assert s.receive(DiscoveryRequest.FromString(raw), raw).kind is RequestKind.INITIAL
    # Another type's request with the same names is not this type's ACK.
    other = _raw(type_url=typeurls.CLUSTER, resource_names=NAMES, response_nonce="1")
    assert s.decode_unchanged(other) is None
    assert s.decode_unchanged(b"\xff") is None  # malformed: decoded whole, and refused there
