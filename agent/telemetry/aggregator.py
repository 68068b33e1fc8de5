"""Istio's standard metrics as series in memory, fed one access log entry at a time (sans-IO).

Series are keyed by their full label values. Memory is bounded twice over:

- at most `max_series` label sets (HTTP and TCP together). An entry that would make one more
  is folded into its family's overflow series, whose labels are all `unknown` but the
  reporter, and counted in `pilotfish_agent_metrics_overflow_total`: a flood of distinct
  callers or response codes costs one series, not one each.
- at most `max_connections` open TCP connections tracked for their byte deltas (Envoy reports
  a connection's bytes so far, periodically and at its end). Past that the oldest is
  forgotten (counted in `pilotfish_agent_metrics_connections_evicted_total`).

`collect()` is a prometheus_client collector, so the agent's registry serves these with its
own metrics on `/stats/prometheus`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from envoy.data.accesslog.v3.accesslog_pb2 import (
    AccessLogType,
    HTTPAccessLogEntry,
    TCPAccessLogEntry,
)

from agent.telemetry.labels import (
    HTTP_LABELS,
    TCP_LABELS,
    UNKNOWN,
    LabelValues,
    caller_unknown_yet,
    http_labels,
    tcp_labels,
)
from agent.telemetry.overrides import SideOverrides, apply, of_entry
from agent.telemetry.peers import PeerDirectory

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

# Envoy's default histogram buckets, which Istio's standard histograms use (milliseconds for
# the duration, bytes for the sizes).
BUCKETS: Final = (
    0.5,
    1.0,
    5.0,
    10.0,
    25.0,
    50.0,
    100.0,
    250.0,
    500.0,
    1000.0,
    2500.0,
    5000.0,
    10000.0,
    30000.0,
    60000.0,
    300000.0,
    600000.0,
    1800000.0,
    3600000.0,
)
DEFAULT_MAX_SERIES: Final = 2000
DEFAULT_MAX_CONNECTIONS: Final = 20000


class Histogram:
    """Counts per bucket (not cumulative; the last slot is +Inf) and the sum."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        # Prometheus buckets are upper-inclusive: `le="5"` counts 5.
        self.counts[bisect_left(BUCKETS, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*map(_le, BUCKETS), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


def _le(bound: float) -> str:
    # Envoy's spelling: `1`, not `1.0`.
    return f"{bound:g}" if bound < 1e6 else f"{bound:.0f}"


@dataclass(slots=True, eq=False)
class HttpSeries:
    """One HTTP series' request count and histograms."""

    requests: int = 0
    duration: Histogram = field(default_factory=Histogram)
    request_bytes: Histogram = field(default_factory=Histogram)
    response_bytes: Histogram = field(default_factory=Histogram)

    def observe(self, duration_ms: float, request_bytes: int, response_bytes: int) -> None:
        # Histogram.observe written out: this runs per request.
        self.requests += 1
        h = self.duration
        h.counts[bisect_left(BUCKETS, duration_ms)] += 1
        h.total += duration_ms
        h = self.request_bytes
        h.counts[bisect_left(BUCKETS, request_bytes)] += 1
        h.total += request_bytes
        h = self.response_bytes
        h.counts[bisect_left(BUCKETS, response_bytes)] += 1
        h.total += response_bytes


@dataclass(slots=True, eq=False)
class TcpSeries:
    """One TCP series' byte and connection counters."""

    sent: int = 0
    received: int = 0
    opened: int = 0
    closed: int = 0


@dataclass(slots=True, eq=False)
class _Connection:
    """An open TCP connection's series key and the bytes already counted."""

    key: LabelValues
    sent: int = 0
    received: int = 0


class MetricsAggregator:
    def __init__(
        self,
        *,
        max_series: int = DEFAULT_MAX_SERIES,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        peers: PeerDirectory | None = None,
    ) -> None:
        self.max_series = max_series
        self.peers = peers  # names upstreams and callers (peers.py)
        self.max_connections = max_connections
        self.http: dict[LabelValues, HttpSeries] = {}
        self.tcp: dict[LabelValues, TcpSeries] = {}
        # Insertion order is age: the first is the oldest, evicted first.
        self._connections: dict[str, _Connection] = {}
        # Per reporter, the Telemetry overrides its latest entry carried (overrides.py).
        self.sides: dict[str, SideOverrides] = {}
        self.entries = 0
        self.overflow = 0
        self.evicted = 0
        # HTTP metrics records that were not lines of the format (records.py).
        self.records_dropped = 0

    @property
    def series(self) -> int:
        return len(self.http) + len(self.tcp)

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def _admit(self, key: LabelValues, table: Mapping[LabelValues, object]) -> LabelValues:
        """`key`, or its family's overflow key when a new series would pass the cap."""
        if key in table or self.series < self.max_series:
            return key
        self.overflow += 1
        return (key[0], *([UNKNOWN] * (len(key) - 1)))

    def record_http(self, entry: HTTPAccessLogEntry) -> None:
        common, request, response = entry.common_properties, entry.request, entry.response
        self.count_http(
            http_labels(entry, self.peers),
            of_entry(common),
            common.duration.ToNanoseconds() / 1e6,
            request.request_headers_bytes + request.request_body_bytes,
            response.response_headers_bytes + response.response_body_bytes,
        )

    def count_http(
        self,
        labels: LabelValues,
        side: SideOverrides,
        duration_ms: float,
        request_bytes: int,
        response_bytes: int,
    ) -> None:
        """One HTTP entry, already read (agent/telemetry/wire.py reads entries off the wire
        this way, with its labels and its logger's overrides cached)."""
        self.entries += 1
        self.sides[labels[0]] = side
        series = self.http_series(labels, side)
        if series is not None:
            series.observe(duration_ms, request_bytes, response_bytes)

    def http_series(self, labels: LabelValues, side: SideOverrides) -> HttpSeries | None:
        """The series an HTTP entry with these labels, from a logger with these overrides,
        counts in (made on first use; the overflow series past the cap); None when the side
        exports no HTTP metric. Series are never dropped and the cap only fills, so the same
        labels and overrides give the same series for the aggregator's life: a caller may
        keep it (records.py does, per record head) and count in it itself, keeping
        `entries` and `sides` as `count_http` does."""
        if side.http_off:
            return None
        labels = side.fold_http(labels)
        series = self.http.get(labels)
        if series is None:
            key = self._admit(labels, self.http)
            series = self.http.get(key)
            if series is None:
                series = self.http[key] = HttpSeries()
        return series

    def record_tcp(self, entry: TCPAccessLogEntry) -> None:
        self.entries += 1
        common = entry.common_properties
        stream = common.stream_id
        conn = self._connections.get(stream) if stream else None
        if conn is None:
            if caller_unknown_yet(common):
                # Who the caller is shows in a later entry; that one counts the connection
                # (Envoy reports totals, so no byte is lost by waiting).
                return
            labels = tcp_labels(entry, self.peers)
            side = self.sides[labels[0]] = of_entry(common)
            if side.tcp_off:
                return
            key = self._admit(side.fold_tcp(labels), self.tcp)
            conn = _Connection(key)
            if stream:
                if len(self._connections) >= self.max_connections:
                    del self._connections[next(iter(self._connections))]
                    self.evicted += 1
                self._connections[stream] = conn
            series = self.tcp.get(key)
            if series is None:
                series = self.tcp[key] = TcpSeries()
            series.opened += 1
        else:
            series = self.tcp[conn.key]
        # Envoy reports totals so far; what is new since the last report is counted.
        sent = entry.connection_properties.sent_bytes
        received = entry.connection_properties.received_bytes
        series.sent += max(0, sent - conn.sent)
        series.received += max(0, received - conn.received)
        conn.sent, conn.received = max(conn.sent, sent), max(conn.received, received)
        if not common.intermediate_log_entry or common.access_log_type == _END:
            series.closed += 1
            if stream:
                self._connections.pop(stream, None)

    # --- prometheus_client collector ----------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        yield from apply(self._families(), self.sides)

    def _families(self) -> Iterator[Metric]:
        # Imported at a scrape, not at the agent's start (see agent/metrics.py).
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        http_labels_ = list(HTTP_LABELS)
        tcp_labels_ = list(TCP_LABELS)
        requests = CounterMetricFamily(
            "istio_requests", "Requests handled by this proxy.", labels=http_labels_
        )
        duration = HistogramMetricFamily(
            "istio_request_duration_milliseconds",
            "Duration of requests in milliseconds.",
            labels=http_labels_,
        )
        request_bytes = HistogramMetricFamily(
            "istio_request_bytes", "Request sizes (headers and body) in bytes.", labels=http_labels_
        )
        response_bytes = HistogramMetricFamily(
            "istio_response_bytes",
            "Response sizes (headers and body) in bytes.",
            labels=http_labels_,
        )
        for key, s in self.http.items():
            values = list(key)
            requests.add_metric(values, s.requests)
            duration.add_metric(values, s.duration.cumulative(), s.duration.total)
            request_bytes.add_metric(values, s.request_bytes.cumulative(), s.request_bytes.total)
            response_bytes.add_metric(values, s.response_bytes.cumulative(), s.response_bytes.total)
        yield from (requests, duration, request_bytes, response_bytes)
        sent = CounterMetricFamily(
            "istio_tcp_sent_bytes",
            "Bytes sent to the downstream on TCP connections.",
            labels=tcp_labels_,
        )
        received = CounterMetricFamily(
            "istio_tcp_received_bytes",
            "Bytes received from the downstream on TCP connections.",
            labels=tcp_labels_,
        )
        opened = CounterMetricFamily(
            "istio_tcp_connections_opened", "TCP connections opened.", labels=tcp_labels_
        )
        closed = CounterMetricFamily(
            "istio_tcp_connections_closed", "TCP connections closed.", labels=tcp_labels_
        )
        for key, tcp in self.tcp.items():
            values = list(key)
            sent.add_metric(values, tcp.sent)
            received.add_metric(values, tcp.received)
            opened.add_metric(values, tcp.opened)
            closed.add_metric(values, tcp.closed)
        yield from (sent, received, opened, closed)
        yield CounterMetricFamily(
            "pilotfish_agent_metrics_entries",
            "Envoy access log entries counted into the standard metrics.",
            value=self.entries,
        )
        yield CounterMetricFamily(
            "pilotfish_agent_metrics_overflow",
            "Entries folded into an `unknown` series because the label-set cap was reached.",
            value=self.overflow,
        )
        yield CounterMetricFamily(
            "pilotfish_agent_metrics_connections_evicted",
            "Open TCP connections forgotten because too many were tracked.",
            value=self.evicted,
        )
        yield CounterMetricFamily(
            "pilotfish_agent_metrics_records_dropped",
            "HTTP metrics records from Envoy dropped as over-long or malformed.",
            value=self.records_dropped,
        )
        yield GaugeMetricFamily(
            "pilotfish_agent_metrics_series",
            "Label sets held for the standard metrics (capped).",
            value=self.series,
        )


_END: Final = AccessLogType.TcpConnectionEnd
