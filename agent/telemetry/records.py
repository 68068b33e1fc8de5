"""HTTP metrics records (one line per request from Envoy's file logger, protos/telemetry.py
has the format) to observations for the aggregator (sans-IO).

- `LineSplitter` turns the bytes read from the FIFO into whole lines, whatever the reads'
  boundaries, holding at most `MAX_RECORD` bytes of a partial line: a longer line is dropped
  (to its end) and counted, never buffered.
- `RecordDecoder` reads a line. The labels depend only on the line up to its value fields,
  so that prefix is the key of a bounded cache of label tuples: a request like an earlier
  one costs a split, a dict lookup and a few int() calls. A miss rebuilds the ALS entry the
  gRPC logger would have sent from the record's fields and runs the same `http_labels` and
  `of_entry` on it, so the labels are those the ALS path computes for the same request.
  A malformed line (wrong version or field count, a number that is not one) is counted and
  dropped.
"""

from __future__ import annotations

import logging
from typing import Final

from envoy.data.accesslog.v3.accesslog_pb2 import HTTPAccessLogEntry

from agent.telemetry.aggregator import HttpSeries, MetricsAggregator
from agent.telemetry.labels import FLAG_FIELDS, LabelValues, http_labels
from agent.telemetry.overrides import SideOverrides, of_entry
from agent.telemetry.peers import PeerDirectory
from agent.telemetry.wire import DEFAULT_MAX_CACHED, MAX_KEY_BYTES, HttpObservation, LabelCache
from protos import telemetry as t

logger = logging.getLogger(__name__)

_SEP: Final = t.RECORD_SEPARATOR.encode()
_VERSION: Final = t.RECORD_VERSION.encode()
_VALUES: Final = len(t.RECORD_VALUE_FIELDS)
_HEAD_FIELDS: Final = 1 + len(t.RECORD_TAGS) + len(t.RECORD_LABEL_FIELDS)
_MISSING: Final = b"-"
# What Envoy writes for a value it does not have.
_ABSENT: Final = "-"


class LineSplitter:
    """Bytes in, whole lines out (without their newline)."""

    def __init__(self, max_line: int = t.MAX_RECORD) -> None:
        self.max_line = max_line
        self._partial = b""
        # Inside an over-long line: everything up to the next newline is dropped.
        self._skipping = False
        self.overlong = 0

    def feed(self, data: bytes) -> list[bytes]:
        if self._skipping:
            end = data.find(b"\n")
            if end < 0:
                return []
            data = data[end + 1 :]
            self._skipping = False
        if self._partial:
            data = self._partial + data
            self._partial = b""
        lines = data.split(b"\n")
        tail = lines.pop()
        if len(tail) > self.max_line:
            self.overlong += 1
            self._skipping = True
        else:
            self._partial = tail
        if any(len(line) > self.max_line for line in lines):
            kept = [line for line in lines if len(line) <= self.max_line]
            self.overlong += len(lines) - len(kept)
            return kept
        return lines


class RecordDecoder(LabelCache):
    """Lines to observations, with the label tuples cached (LabelCache)."""

    def __init__(
        self, max_cached: int = DEFAULT_MAX_CACHED, peers: PeerDirectory | None = None
    ) -> None:
        super().__init__(max_cached, peers)
        self.lines = 0
        self.malformed = 0

    def decode(self, line: bytes) -> HttpObservation | None:
        """The line's observation; None (counted in `malformed`) when it is not a record."""
        self.lines += 1
        parts = line.rsplit(_SEP, _VALUES)
        if len(parts) != _VALUES + 1:
            self.malformed += 1
            return None
        head = parts[0]
        cached = self._labels.get(head)
        if cached is None:
            cached = _labels_of(head, self.peers)
            if cached is None:
                self.malformed += 1
                return None
            self.misses += 1
            self._remember(head, cached)
        else:
            self.hits += 1
        _, us, ms, rq_headers, rq_body, rs_headers, rs_body = parts
        try:
            duration = int(us) / 1000 if us != _MISSING else float(_count(ms))
            request = _count(rq_headers) + _count(rq_body)
            response = _count(rs_headers) + _count(rs_body)
        except ValueError:
            self.malformed += 1
            return None
        return HttpObservation(*cached, duration, request, response)


class RecordFeed:
    """The FIFO's bytes into the aggregator (the consumer agent/telemetry/fifo.py calls).
    Dropped lines are counted in the aggregator's `records_dropped`; the first is logged
    (Envoy writes none: one means a bug or a version mismatch, not a caller's doing)."""

    def __init__(self, aggregator: MetricsAggregator, max_cached: int = DEFAULT_MAX_CACHED):
        self.aggregator = aggregator
        self.splitter = LineSplitter()
        self.decoder = RecordDecoder(max_cached, aggregator.peers)
        # Per record head: its reporter, overrides, series (None: not exported) and whether
        # that is the overflow series (each entry folded into it is counted), so that
        # a repeat costs a split, a lookup and the counting, without the decoder's objects.
        # Bounded as the decoder's label sets, and forgotten with them (a new peer table).
        self._targets: dict[bytes, tuple[str, SideOverrides, HttpSeries | None, bool]] = {}
        self._peer_tables = -1

    def __call__(self, data: bytes) -> None:
        splitter, decoder, aggregator = self.splitter, self.decoder, self.aggregator
        decoder.follow_peers()
        peers = decoder.peers
        if peers is not None and peers.updates != self._peer_tables:
            self._peer_tables = peers.updates
            self._targets.clear()
        targets, sides, missing = self._targets, aggregator.sides, _MISSING
        seen = (splitter.overlong, decoder.malformed)
        for line in splitter.feed(data):
            parts = line.rsplit(_SEP, _VALUES)
            target = targets.get(parts[0]) if len(parts) == _VALUES + 1 else None
            if target is None:
                self._first(line)
                continue
            decoder.lines += 1
            _, us, ms, rq_headers, rq_body, rs_headers, rs_body = parts
            try:
                duration = int(us) / 1000 if us != missing else float(_count(ms))
                request = (int(rq_headers) if rq_headers != missing else 0) + (
                    int(rq_body) if rq_body != missing else 0
                )
                response = (int(rs_headers) if rs_headers != missing else 0) + (
                    int(rs_body) if rs_body != missing else 0
                )
            except ValueError:
                decoder.malformed += 1
                continue
            decoder.hits += 1
            aggregator.entries += 1
            reporter, side, series, folded = target
            sides[reporter] = side
            if series is not None:
                series.observe(duration, request, response)
                if folded:
                    aggregator.overflow += 1
        if splitter.overlong and not seen[0]:
            logger.warning("dropping an over-long metrics record (over %d bytes)", t.MAX_RECORD)
        if (splitter.overlong, decoder.malformed) != seen:
            self.aggregator.records_dropped = splitter.overlong + decoder.malformed

    def _first(self, line: bytes) -> None:
        """A line whose head has no kept target: decoded and counted in full, and its target
        kept for the next."""
        decoder = self.decoder
        observation = decoder.decode(line)
        if observation is None:
            if decoder.malformed == 1:
                logger.warning("dropping a malformed metrics record: %.200r", line)
            return
        labels, side = observation.labels, observation.side
        aggregator = self.aggregator
        aggregator.entries += 1
        aggregator.sides[labels[0]] = side
        before = aggregator.overflow
        series = aggregator.http_series(labels, side)
        if series is not None:
            series.observe(*observation[2:])
        head = line.rsplit(_SEP, _VALUES)[0]
        if len(head) <= MAX_KEY_BYTES:
            if len(self._targets) >= decoder.max_cached:
                del self._targets[next(iter(self._targets))]
            self._targets[head] = (labels[0], side, series, aggregator.overflow != before)


def _count(value: bytes) -> int:
    return int(value) if value != _MISSING else 0


def _labels_of(
    head: bytes, peers: PeerDirectory | None
) -> tuple[LabelValues, SideOverrides] | None:
    fields = head.decode("utf-8", "replace").split(t.RECORD_SEPARATOR)
    if len(fields) != _HEAD_FIELDS or fields[0] != t.RECORD_VERSION:
        return None
    entry = entry_of(fields[1 : 1 + len(t.RECORD_TAGS)], fields[1 + len(t.RECORD_TAGS) :])
    if entry is None:
        return None
    return http_labels(entry, peers), of_entry(entry.common_properties)


def entry_of(tags: list[str], values: list[str]) -> HTTPAccessLogEntry | None:
    """The ALS entry (as far as labels read one) that the gRPC logger would have sent for
    a record with these tags and label fields; None when a field cannot be one."""
    got = dict(zip((name for name, _ in t.RECORD_LABEL_FIELDS), values, strict=True))
    value = {k: "" if v == _ABSENT else v for k, v in got.items()}
    code = value["response_code"]
    if not code.isdigit() or len(code) > 3:
        return None
    entry = HTTPAccessLogEntry()
    common, request, response = entry.common_properties, entry.request, entry.response
    for name, tag in zip(t.RECORD_TAGS, tags, strict=True):
        if tag:
            common.custom_tags[name] = tag
    if value["upstream_principal"]:
        meta = common.metadata.filter_metadata[t.METADATA_NAMESPACE]
        meta.fields[t.METADATA_UPSTREAM_PRINCIPAL].string_value = value["upstream_principal"]
    tls = common.tls_properties
    for cert, field in (
        (tls.peer_certificate_properties, "peer_uri_san"),
        (tls.local_certificate_properties, "local_uri_san"),
    ):
        for uri in value[field].split(","):
            if uri:
                cert.subject_alt_name.add(uri=uri)
    common.upstream_cluster = value["upstream_cluster"]
    if value["upstream_host"]:
        common.upstream_remote_address.socket_address.address = value["upstream_host"]
    if value["peer_host"]:
        common.downstream_direct_remote_address.socket_address.address = value["peer_host"]
    for short in value["response_flags"].split(","):
        flag = FLAG_FIELDS.get(short)
        if flag == "unauthorized_details":
            details = common.response_flags.unauthorized_details
            details.reason = details.EXTERNAL_SERVICE
        elif flag is not None:
            setattr(common.response_flags, flag, True)
    request.authority = value["authority"]
    if value["content_type"]:
        request.request_headers["content-type"] = value["content_type"]
    response.response_code.value = int(code)
    if value["grpc_status_header"]:
        response.response_headers["grpc-status"] = value["grpc_status_header"]
    if value["grpc_status_trailer"]:
        response.response_trailers["grpc-status"] = value["grpc_status_trailer"]
    return entry
