"""The agent's hot path for access log entries: reduced decoding and the bounded cache of
label sets (agent/telemetry/wire.py), checked against the full decoding it replaces, and the
access log service counting nothing of a message that does not decode."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from envoy.data.accesslog.v3.accesslog_pb2 import AccessLogType, HTTPAccessLogEntry
from envoy.service.accesslog.v3.als_pb2 import StreamAccessLogsMessage, StreamAccessLogsResponse
from google.protobuf.message import DecodeError

from agent.telemetry.aggregator import MetricsAggregator
from agent.telemetry.als import SERVICE, AccessLogServer
from agent.telemetry.labels import HTTP_LABELS, http_labels
from agent.telemetry.wire import MAX_KEY_BYTES, HttpDecoder, stream_entries
from protos import peers_pb2
from protos import telemetry as t
from tests.unit.test_telemetry_metrics import (
    CLIENT,
    CLIENT_IP,
    PEERS,
    SERVER,
    SERVER_IP,
    client_entry,
    peer_table,
    server_entry,
    tcp_entry,
)


def _raw(entry: HTTPAccessLogEntry) -> bytes:
    return entry.SerializeToString()


def _vary_per_request_fields(e: HTTPAccessLogEntry, i: int) -> HTTPAccessLogEntry:
    """What differs between two requests of one caller to one service: none of it is a
    label."""
    c = e.common_properties
    c.stream_id = f"stream-{i}"
    c.start_time.FromNanoseconds(1_700_000_000_000_000_000 + i)
    c.time_to_last_rx_byte.FromNanoseconds(1000 + i)
    c.duration.FromNanoseconds(1_000_000 * (i + 1))
    # (Envoy's "remote address" may come from x-forwarded-for: never read. The caller's
    # socket address names it: the same caller, a new port per connection.)
    c.downstream_remote_address.socket_address.address = f"10.0.0.{i % 250}"
    c.downstream_remote_address.socket_address.port_value = 30000 + i
    c.downstream_direct_remote_address.socket_address.port_value = 30000 + i
    # (The upstream's address names it: the same endpoint, a new local port.)
    c.upstream_local_address.socket_address.address = f"10.1.0.{i % 250}"
    c.upstream_local_address.socket_address.port_value = 40000 + i
    c.upstream_wire_bytes_sent = 300 + i
    c.tls_properties.tls_session_id = f"{i:08x}"
    c.tls_properties.tls_sni_hostname = "web.example.com"
    c.access_log_type = AccessLogType.DownstreamEnd
    e.request.path = f"/items/{i}"
    e.request.user_agent = f"agent/{i}"
    e.request.request_id = f"id-{i}"
    e.request.request_headers_bytes = 100 + i
    e.response.response_code_details = "via_upstream"
    e.response.response_body_bytes = 10 * i
    return e


def test_decoded_observations_are_those_of_the_full_entry() -> None:
    dec = HttpDecoder(peers=PEERS)
    for entry in (
        server_entry(),
        server_entry(peer=None),
        server_entry(code=503, duration_ms=700.0, authority="web.shop"),
        client_entry(),
        client_entry(upstream=""),
        _vary_per_request_fields(server_entry(), 7),
        _vary_per_request_fields(client_entry(), 7),
    ):
        got = dec.decode(_raw(entry))
        c, req, resp = entry.common_properties, entry.request, entry.response
        assert got.labels == http_labels(entry, PEERS)
        assert got.duration_ms == c.duration.ToNanoseconds() / 1e6
        assert got.request_bytes == req.request_headers_bytes + req.request_body_bytes
        assert got.response_bytes == resp.response_headers_bytes + resp.response_body_bytes


def test_per_request_fields_are_no_part_of_the_labels() -> None:
    """The cache key leaves these out, so labels must not depend on them: if labels.py
    starts reading one, this fails (and the field belongs in wire.py's `_LABEL_FIELDS`)."""
    for entry in (server_entry, client_entry):
        base = http_labels(entry(), PEERS)
        for i in range(3):
            assert http_labels(_vary_per_request_fields(entry(), i), PEERS) == base


def test_a_repeat_request_is_a_cache_hit_with_its_own_values() -> None:
    dec = HttpDecoder()
    first = dec.decode(_raw(_vary_per_request_fields(server_entry(), 1)))
    second = dec.decode(_raw(_vary_per_request_fields(server_entry(), 2)))
    assert (dec.misses, dec.hits, dec.cached) == (1, 1, 1)
    assert first.labels == second.labels
    assert (first.duration_ms, second.duration_ms) == (2.0, 3.0)
    assert (first.request_bytes, second.request_bytes) == (121, 122)


def test_a_change_in_anything_labelled_is_a_new_label_set() -> None:
    # Two workloads per principal: an address names one of them.
    peers = peer_table(
        (SERVER_IP, "web", "v1", SERVER),
        ("10.0.0.10", "web-canary", "v2", SERVER),
        (CLIENT_IP, "client", "v2", CLIENT),
        ("10.0.0.8", "client-canary", "v3", CLIENT),
    )
    dec = HttpDecoder(peers=peers)
    flagged = server_entry()
    flagged.common_properties.response_flags.upstream_request_timeout = True
    entries = [
        server_entry(),
        server_entry(code=503),
        server_entry(remote="10.0.0.8"),
        server_entry(peer="spiffe://cluster.local/ns/jobs/sa/batch"),
        server_entry(peer=None),
        server_entry(authority="db.shop.svc.cluster.local"),
        flagged,
        client_entry(),
        client_entry(host="10.0.0.10"),
        client_entry(upstream=""),
    ]
    got = [dec.decode(_raw(e)).labels for e in entries]
    assert got == [http_labels(e, peers) for e in entries]
    assert len(set(got)) == len(entries)
    assert dec.misses == len(entries)
    # And each is remembered under its own key, not another's.
    again = [dec.decode(_raw(e)).labels for e in entries]
    assert again == got and dec.hits == len(entries)


def test_the_cache_is_bounded_and_stays_correct_past_its_bound() -> None:
    dec = HttpDecoder(max_cached=3)
    entries = [server_entry(code=200 + i) for i in range(10)]
    for _ in range(2):
        for e in entries:
            assert dec.decode(_raw(e)).labels == http_labels(e)
            assert dec.cached <= 3
    assert dec.cached == 3


def test_an_oversized_key_is_decoded_but_not_cached() -> None:
    dec = HttpDecoder()
    huge = server_entry(authority="a" * (MAX_KEY_BYTES + 1) + ".shop")
    for _ in range(2):
        assert dec.decode(_raw(huge)).labels == http_labels(huge)
    assert (dec.misses, dec.cached) == (2, 0)


def test_grpc_status_and_protocol_come_through() -> None:
    dec = HttpDecoder()
    e = client_entry()
    got = dict(zip(HTTP_LABELS, dec.decode(_raw(e)).labels, strict=True))
    assert (got["request_protocol"], got["grpc_response_status"]) == ("grpc", "14")
    e.response.response_trailers["grpc-status"] = "0"
    assert dec.decode(_raw(e)).labels == http_labels(e) != http_labels(client_entry())


def test_stream_entries_keep_http_and_tcp_apart() -> None:
    message = StreamAccessLogsMessage()
    message.http_logs.log_entry.append(server_entry())
    message.http_logs.log_entry.append(client_entry())
    message.identifier.log_name = t.LOG_NAME
    got = stream_entries(message.SerializeToString())
    assert [HTTPAccessLogEntry.FromString(r) for r in got.http] == list(message.http_logs.log_entry)
    assert got.tcp == []
    tcp = StreamAccessLogsMessage()
    tcp.tcp_logs.log_entry.append(tcp_entry("c1", AccessLogType.TcpConnectionEnd, 1, 2))
    assert len(stream_entries(tcp.SerializeToString()).tcp) == 1


def test_garbage_does_not_decode() -> None:
    with pytest.raises(DecodeError):
        stream_entries(b"\x0a\xff\xff\xff")
    with pytest.raises(DecodeError):
        HttpDecoder().decode(b"\x0a\x05\x01")


async def test_a_message_with_a_bad_entry_counts_nothing_and_ends_its_stream(
    tmp_path: Path,
) -> None:
    agg = MetricsAggregator()
    good = StreamAccessLogsMessage()
    good.http_logs.log_entry.extend([server_entry(), server_entry(code=503)])
    bad = StreamAccessLogsMessage()
    bad.http_logs.log_entry.append(server_entry())
    # A second entry (http_logs, field 2; log_entry, field 1), truncated.
    raw_bad = bad.SerializeToString() + b"\x12\x05\x0a\x03\x0a\xff\x01"
    async with AccessLogServer(tmp_path / "ALS", agg) as server:
        async with grpc.aio.insecure_channel(f"unix:{tmp_path / 'ALS'}") as channel:
            call = channel.stream_unary(
                f"/{SERVICE}/StreamAccessLogs",
                request_serializer=lambda b: b,
                response_deserializer=StreamAccessLogsResponse.FromString,
            )
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await call(iter([good.SerializeToString(), raw_bad]), timeout=10)
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (agg.entries, server.malformed) == (2, 1)
    assert sorted(s.requests for s in agg.http.values()) == [1, 1]


async def test_the_access_log_service_names_upstreams_from_the_newest_table(
    tmp_path: Path,
) -> None:
    """Label sets cached from one peer table are forgotten when another arrives."""
    peers = peer_table((SERVER_IP, "web", "v1", SERVER))
    agg = MetricsAggregator(peers=peers)
    message = StreamAccessLogsMessage()
    message.http_logs.log_entry.append(client_entry())
    raw = message.SerializeToString()
    async with AccessLogServer(tmp_path / "ALS", agg):
        async with grpc.aio.insecure_channel(f"unix:{tmp_path / 'ALS'}") as channel:
            call = channel.stream_unary(
                f"/{SERVICE}/StreamAccessLogs",
                request_serializer=lambda b: b,
                response_deserializer=StreamAccessLogsResponse.FromString,
            )
            await call(iter([raw, raw]), timeout=10)
            peers([peers_pb2.PeerTable()])  # web left that address
            await call(iter([raw]), timeout=10)
    workloads = {labels[6]: s.requests for labels, s in agg.http.items()}
    assert workloads == {"web": 2, "unknown": 1}
