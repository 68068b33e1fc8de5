"""HTTP metrics records without Envoy (agent/telemetry/records.py, protos/telemetry.py): lines
split from reads of any size, over-long and malformed lines dropped and counted, labels equal
to those the ALS path computes from the entry the gRPC logger would have sent for the same
request, and the format's literal tags escaped; the FIFO read on a real event loop."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest
from envoy.data.accesslog.v3.accesslog_pb2 import HTTPAccessLogEntry

from agent.telemetry.aggregator import MetricsAggregator
from agent.telemetry.fifo import MetricsFifo
from agent.telemetry.labels import http_labels, response_flags
from agent.telemetry.overrides import of_entry
from agent.telemetry.records import LineSplitter, RecordDecoder, RecordFeed
from agent.telemetry.wire import MAX_KEY_BYTES
from control.model.proxy import proxy_from_node
from protos import peers_pb2
from protos import telemetry as t
from tests.unit.test_telemetry_metrics import (
    CLIENT,
    PEERS,
    SERVER,
    SERVER_IP,
    client_entry,
    peer_table,
    server_entry,
)

SEP = t.RECORD_SEPARATOR


def record(
    entry: HTTPAccessLogEntry,
    *,
    duration_us: str | None = None,
    extra: str = "",
    unread: str = "-",
) -> bytes:
    """The line Envoy's file logger writes for the request `entry` describes (what the
    record format's commands print for it; `-` for what is missing). The fields the
    reporter's format leaves out (`RECORD_UNREAD_FIELDS`) hold `unread`."""
    c, rq, rs = entry.common_properties, entry.request, entry.response
    meta = c.metadata.filter_metadata.get(t.METADATA_NAMESPACE)
    fields = meta.fields if meta is not None else {}
    upstream_principal = fields[t.METADATA_UPSTREAM_PRINCIPAL].string_value if fields else ""

    def sans(cert: object) -> str:
        return ",".join(s.uri for s in cert.subject_alt_name)  # type: ignore[attr-defined]

    flags = response_flags(c.response_flags)
    label_values = {
        "peer_host": c.downstream_direct_remote_address.socket_address.address,
        "upstream_principal": upstream_principal,
        "upstream_host": c.upstream_remote_address.socket_address.address,
        "peer_uri_san": sans(c.tls_properties.peer_certificate_properties),
        "local_uri_san": sans(c.tls_properties.local_certificate_properties),
        "upstream_cluster": c.upstream_cluster,
        "response_flags": flags,
        "authority": rq.authority,
        "content_type": rq.request_headers.get("content-type", ""),
        "response_code": str(rs.response_code.value),
        "grpc_status_header": rs.response_headers.get("grpc-status", ""),
        "grpc_status_trailer": rs.response_trailers.get("grpc-status", ""),
    }
    ms = c.duration.ToNanoseconds() // 1_000_000
    us = c.duration.ToNanoseconds() // 1000
    values = {
        "duration_us": str(us) if duration_us is None else duration_us,
        "duration_ms": str(ms),
        "request_headers_bytes": str(rq.request_headers_bytes),
        "request_body_bytes": str(rq.request_body_bytes),
        "response_headers_bytes": str(rs.response_headers_bytes),
        "response_body_bytes": str(rs.response_body_bytes),
    }
    tags = [c.custom_tags.get(k, "") for k in t.RECORD_TAGS]
    skipped = t.RECORD_UNREAD_FIELDS[c.custom_tags[t.TAG_REPORTER]]
    parts = [
        t.RECORD_VERSION,
        *tags,
        *(unread if n in skipped else label_values[n] or "-" for n, _ in t.RECORD_LABEL_FIELDS),
        *(values[n] for n, _ in t.RECORD_VALUE_FIELDS),
    ]
    return (SEP.join(parts) + extra + "\n").encode()


def _entries() -> list[HTTPAccessLogEntry]:
    """Requests whose labels differ in every way the trust rules and names can."""
    flagged = server_entry(code=503)
    flagged.common_properties.response_flags.upstream_connection_failure = True
    flagged.common_properties.response_flags.no_healthy_upstream = True
    flagged.common_properties.response_flags.unauthorized_details.reason = 1
    no_cluster = client_entry()
    no_cluster.common_properties.upstream_cluster = ""
    no_cluster.request.authority = "web.shop"
    overridden = server_entry()
    overridden.common_properties.custom_tags[t.TAG_OVERRIDES] = t.encode_overrides(
        frozenset({"REQUEST_COUNT"}), {"REQUEST_DURATION": frozenset({"request_protocol"})}
    )
    grpc_header = client_entry()
    del grpc_header.response.response_trailers["grpc-status"]
    grpc_header.response.response_headers["grpc-status"] = "3"
    return [
        server_entry(),
        server_entry(peer=None),  # plaintext: not named
        server_entry(remote="10.0.0.10"),  # an address the table does not give the client
        server_entry(peer="spiffe://cluster.local/ns/shop/sa/other"),  # not the client
        server_entry(authority="10.0.0.1:8080"),
        server_entry(code=0),  # no response (a reset)
        flagged,
        client_entry(),
        client_entry(upstream=""),  # plaintext upstream: not named
        client_entry(host="10.0.0.10"),  # an address the table does not hold
        grpc_header,
        no_cluster,
        overridden,
    ]


@pytest.mark.parametrize("index", range(len(_entries())))
def test_labels_are_those_of_the_als_entry_for_the_same_request(index: int) -> None:
    entry = _entries()[index]
    observation = RecordDecoder(peers=PEERS).decode(record(entry)[:-1])
    assert observation is not None
    assert observation.labels == http_labels(entry, PEERS)
    assert observation.side == of_entry(entry.common_properties)
    c, rq, rs = entry.common_properties, entry.request, entry.response
    assert observation.duration_ms == pytest.approx(c.duration.ToNanoseconds() / 1e6, abs=1e-3)
    assert observation.request_bytes == rq.request_headers_bytes + rq.request_body_bytes
    assert observation.response_bytes == rs.response_headers_bytes + rs.response_body_bytes


@pytest.mark.parametrize("index", range(len(_entries())))
def test_fields_a_side_leaves_out_change_no_label(index: int) -> None:
    """What a side's format writes as `-` instead of a command, its labels never read: the
    same request with anything there (a certificate, a cluster) has the same labels."""
    entry = _entries()[index]
    for junk in (
        "spiffe://cluster.local/ns/kube-system/sa/admin",
        "outbound|1||x.y.svc.z",
        "10.0.0.9",
        "10.0.0.7",
    ):
        observation = RecordDecoder(peers=PEERS).decode(record(entry, unread=junk)[:-1])
        assert observation is not None
        assert observation.labels == http_labels(entry, PEERS)


def test_each_side_formats_only_the_fields_it_reads() -> None:
    def commands(reporter: str) -> dict[str, str]:
        fields = t.record_format({t.TAG_REPORTER: reporter})[:-1].split(SEP)
        names = [n for n, _ in t.RECORD_LABEL_FIELDS]
        return dict(zip(names, fields[1 + len(t.RECORD_TAGS) :], strict=False))

    client, server = commands(t.REPORTER_SOURCE), commands(t.REPORTER_DESTINATION)
    assert client["upstream_principal"] == "%UPSTREAM_PEER_URI_SAN%"
    assert client["upstream_host"] == "%UPSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%"
    assert client["peer_host"] == client["peer_uri_san"] == client["local_uri_san"] == "-"
    assert server["upstream_principal"] == server["upstream_cluster"] == "-"
    assert server["upstream_host"] == "-"
    assert server["peer_uri_san"] == "%DOWNSTREAM_PEER_URI_SAN%"
    # The socket's peer, not an address x-forwarded-for could name.
    assert server["peer_host"] == "%DOWNSTREAM_DIRECT_REMOTE_ADDRESS_WITHOUT_PORT%"


def test_values_without_envoys_microseconds_use_its_milliseconds() -> None:
    entry = server_entry(duration_ms=7.4)
    observation = RecordDecoder().decode(record(entry, duration_us="-")[:-1])
    assert observation is not None and observation.duration_ms == 7.0


def test_repeat_requests_hit_the_cache_and_keep_their_own_values() -> None:
    dec = RecordDecoder()
    durations = []
    for i in range(50):
        observation = dec.decode(record(server_entry(duration_ms=i + 0.5))[:-1])
        assert observation is not None
        durations.append(observation.duration_ms)
    assert (dec.misses, dec.hits, dec.cached) == (1, 49, 1)
    assert durations == [i + 0.5 for i in range(50)]


def test_the_label_cache_is_bounded() -> None:
    dec = RecordDecoder(max_cached=8)
    for i in range(100):
        assert dec.decode(record(server_entry(authority=f"web-{i}:8080"))[:-1]) is not None
    assert dec.cached == 8
    long = dec.decode(record(server_entry(authority="w" * (MAX_KEY_BYTES + 1)))[:-1])
    assert long is not None and long.labels[0] == "destination"
    assert dec.cached == 8  # counted, not kept


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"garbage",
        record(server_entry()).replace(t.RECORD_VERSION.encode(), b"pf9", 1)[:-1],  # another
        record(server_entry(), extra=SEP + "x")[:-1],  # one field too many
        record(server_entry()).replace(SEP.encode(), b"", 1)[:-1],  # one too few
        record(server_entry(code=200)).replace(b"\x1f200\x1f", b"\x1fabc\x1f", 1)[:-1],
        record(server_entry(code=200)).replace(b"\x1f200\x1f", b"\x1f99999\x1f", 1)[:-1],
        record(server_entry()).rsplit(SEP.encode(), 1)[0] + SEP.encode() + b"many",
        record(server_entry(), duration_us="1e3")[:-1],
    ],
)
def test_a_malformed_record_is_dropped_and_counted(line: bytes) -> None:
    dec = RecordDecoder()
    assert dec.decode(line) is None
    assert dec.malformed == 1
    # And the next good one is counted as ever.
    assert dec.decode(record(server_entry())[:-1]) is not None


def test_a_separator_inside_a_value_cannot_move_fields() -> None:
    """Envoy's codecs refuse control bytes in header values, so Envoy writes no such line;
    if one came anyway, its field count is wrong and it is dropped, not misread."""
    dec = RecordDecoder()
    forged = record(server_entry(authority=f"web{SEP}x"))
    assert dec.decode(forged[:-1]) is None and dec.malformed == 1


def test_lines_split_across_reads_at_every_position() -> None:
    data = record(server_entry()) + record(client_entry()) + record(server_entry(code=503))
    want = data.split(b"\n")[:-1]
    for cut in range(len(data) + 1):
        splitter = LineSplitter()
        got = splitter.feed(data[:cut]) + splitter.feed(data[cut:])
        assert got == want, cut
    one_byte = LineSplitter()
    got = [line for b in data for line in one_byte.feed(bytes([b]))]
    assert got == want


def test_an_over_long_line_is_dropped_and_counted_wherever_it_ends() -> None:
    good = record(server_entry())
    long = b"x" * 100 + b"\n"
    splitter = LineSplitter(max_line=64)
    # Whole in one read, then spread over three reads (its end in the last).
    assert splitter.feed(good[:10] + b"\n" + long + b"ok\n") == [good[:10], b"ok"]
    assert splitter.overlong == 1
    assert splitter.feed(b"y" * 70) == []
    assert splitter.feed(b"y" * 70) == []
    assert splitter.feed(b"yy\nafter\n") == [b"after"]
    assert splitter.overlong == 2
    # A line of exactly the limit is kept.
    assert splitter.feed(b"z" * 64 + b"\n") == [b"z" * 64]


def test_the_feed_counts_what_it_drops_into_the_aggregator() -> None:
    agg = MetricsAggregator()
    feed = RecordFeed(agg)
    good = record(server_entry())
    feed(good + b"junk\n" + good[:30])
    feed(good[30:] + b"x" * (t.MAX_RECORD + 1) + b"\n" + good)
    assert agg.entries == 3
    assert agg.records_dropped == 2  # the junk line and the over-long one
    assert sum(s.requests for s in agg.http.values()) == 3


def test_literal_tags_are_escaped_in_the_format() -> None:
    tags = {t.TAG_REPORTER: "source", t.TAG_WORKLOAD: "a%b\x1fc\nd", t.TAG_APP: "%DURATION%"}
    fmt = t.record_format(tags)
    assert fmt.endswith("\n") and fmt.count("\n") == 1
    fields = fmt[:-1].split(SEP)
    assert len(fields) == 1 + len(t.RECORD_TAGS) + len(t.RECORD_LABEL_FIELDS) + len(
        t.RECORD_VALUE_FIELDS
    )
    got = dict(zip(t.RECORD_TAGS, fields[1:], strict=False))
    assert got[t.TAG_WORKLOAD] == "a%%b_c_d"
    assert got[t.TAG_APP] == "%%DURATION%%"
    assert got[t.TAG_VERSION] == ""


@pytest.mark.parametrize(
    ("path", "ok"),
    [
        ("/var/run/pilotfish/METRICS", True),
        ("relative/METRICS", False),
        ("", False),
        ("/tmp/%DURATION%", False),
        ("/tmp/a\nb", False),
        ("/" + "a" * t.MAX_LOG_PATH, False),
    ],
)
def test_the_control_plane_takes_only_a_safe_log_path(path: str, ok: bool) -> None:
    assert t.valid_log_path(path) is ok
    proxy = proxy_from_node(
        "sidecar~10.0.0.1~web-1.shop~shop.svc.cluster.local",
        {t.ALS_NODE_METADATA: "true", t.LOG_NODE_METADATA: path},
    )
    assert proxy.metrics_log == (path if ok else "")


async def test_the_fifo_is_private_and_read_on_the_loop(tmp_path: Path) -> None:
    fifo = MetricsFifo(tmp_path / "METRICS")
    fifo.open()
    mode = os.stat(tmp_path / "METRICS").st_mode
    assert stat.S_ISFIFO(mode) and stat.S_IMODE(mode) == 0o600
    agg = MetricsAggregator()
    fifo.start(RecordFeed(agg))
    # Envoy opens the path for writing; with the agent's reader open it does not block.
    writer = os.open(tmp_path / "METRICS", os.O_WRONLY | os.O_NONBLOCK)
    try:
        line = record(server_entry())
        os.write(writer, line * 300 + line[:20])
        os.write(writer, line[20:])
        for _ in range(200):
            if agg.entries == 301:
                break
            await asyncio.sleep(0.01)
        assert agg.entries == 301 and agg.records_dropped == 0
    finally:
        os.close(writer)
        await fifo.close()
    assert not (tmp_path / "METRICS").exists()


def test_a_new_peer_table_is_read_by_the_next_batch() -> None:
    """Labels cached from one table are forgotten when another arrives: the upstream moved."""
    peers = peer_table((SERVER_IP, "web", "v1", SERVER))
    agg = MetricsAggregator(peers=peers)
    feed = RecordFeed(agg)
    line = record(client_entry())
    feed(line)
    peers([peers_pb2.PeerTable()])  # web left that address
    feed(line)
    workloads = {labels[6]: s.requests for labels, s in agg.http.items()}
    assert workloads == {"web": 1, "unknown": 1}
    assert feed.decoder.misses == 2


def test_principals_come_from_certificates_in_records_too() -> None:
    """The SANs name the principals."""
    observation = RecordDecoder().decode(record(server_entry())[:-1])
    assert observation is not None
    assert (observation.labels[3], observation.labels[8]) == (CLIENT, SERVER)


def test_the_feed_counts_as_the_aggregator_does_entry_by_entry() -> None:
    """Repeat heads take the feed's short path (a kept series); it must count what
    `record_http` counts for the same requests: series, histograms, the overflow series past
    the cap, a side whose overrides export no HTTP metric, and the reporters' overrides."""
    http_off = server_entry(authority="quiet:8080")
    http_off.common_properties.custom_tags[t.TAG_OVERRIDES] = t.encode_overrides(
        frozenset(t.HTTP_METRICS), {}
    )
    kinds = [
        *_entries(),
        http_off,
        *(server_entry(authority=f"web-{i}:8080") for i in range(6)),  # past the cap
    ]
    requests = [
        kinds[(i * 7) % len(kinds)]
        for i in range(400)  # every kind, repeated, interleaved
    ]
    for n, e in enumerate(requests):
        e.common_properties.duration.FromNanoseconds(1_000_000 * (n % 13) + 250_000)
        e.request.request_body_bytes = n * 31
        e.response.response_body_bytes = n * 17
    fed, direct = (MetricsAggregator(max_series=12, peers=PEERS) for _ in range(2))
    feed = RecordFeed(fed)
    data = b"".join(record(e) for e in requests)
    for cut in range(0, len(data), 4096):  # reads of a pipe's size
        feed(data[cut : cut + 4096])
    for e in requests:
        direct.record_http(e)

    def counted(agg: MetricsAggregator) -> dict[object, object]:
        return {
            labels: (
                s.requests,
                s.duration.counts,
                round(s.duration.total, 6),
                s.request_bytes.counts,
                s.request_bytes.total,
                s.response_bytes.counts,
                s.response_bytes.total,
            )
            for labels, s in agg.http.items()
        }

    assert fed.entries == direct.entries == len(requests)
    assert counted(fed) == counted(direct)
    assert fed.overflow == direct.overflow > 0
    assert fed.series == direct.series == 12 + 1  # the overflow series
    assert fed.sides == direct.sides
    assert feed.decoder.hits > len(requests) // 2  # most lines took the short path
