"""The service graph from two snapshots of Istio's standard metrics (sans-IO).

Nodes are workloads (`wl:<ns>/<name>`), services (`svc:<fqdn>`) and `unknown` (callers
outside the mesh); edges run from a calling workload to the service it called, and from the
service to the workload that served it (Kiali's "service nodes"). What an edge carries is the
change of each counter between the two snapshots, per second of the interval each target was
read over:

- request rate and error rate (the 5xx share of `istio_requests_total`),
- p50/p90/p99 latency from `istio_request_duration_milliseconds_bucket`,
- TCP bytes per second (`istio_tcp_sent_bytes_total` / `istio_tcp_received_bytes_total`),
- mTLS: the share of the traffic with `connection_security_policy="mutual_tls"`.

Every request is reported twice, by the caller's proxy (`reporter="source"`) and by the
server's (`reporter="destination"`); an edge takes the destination's report when there is one
(only the server knows whether its connection was mutual TLS) and the source's otherwise (a
server without a sidecar), never both.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from control.ui.quantile import histogram_quantile
from control.ui.samples import (
    DURATION_BUCKET,
    REQUESTS,
    TCP_RECEIVED,
    TCP_SENT,
    Sample,
    Snapshot,
)

UNKNOWN = "unknown"
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


@dataclass(frozen=True, slots=True)
class Node:
    id: str
    kind: str  # "workload" | "service" | "unknown"
    namespace: str
    name: str
    app: str = ""

    def as_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "app": self.app,
        }


@dataclass(frozen=True, slots=True)
class Edge:
    source: str
    target: str
    reporter: str  # whose report the numbers are: "destination" or "source"
    protocol: str  # "http", "grpc", "tcp", …
    rps: float
    error_rate: float | None  # 5xx share of requests; None without requests
    codes: Mapping[str, float]  # response code -> requests per second
    latency_ms: Mapping[str, float | None]  # p50/p90/p99; None without observations
    tcp_sent_bps: float
    tcp_received_bps: float
    mtls_share: float | None  # None: the reporter cannot tell (a source report)

    @property
    def id(self) -> str:
        return f"{self.source}>{self.target}"

    @property
    def mtls(self) -> bool | None:
        """True when all of the traffic was mutual TLS, False when not all of it was, None when
        the report cannot say (a source reporter does not see the server's TLS)."""
        return None if self.mtls_share is None else self.mtls_share >= 0.999

    def as_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "source": self.source,
            "target": self.target,
            "reporter": self.reporter,
            "protocol": self.protocol,
            "rps": _round(self.rps),
            "error_rate": None if self.error_rate is None else _round(self.error_rate),
            "codes": {c: _round(r) for c, r in sorted(self.codes.items())},
            "latency_ms": {k: None if v is None else _round(v) for k, v in self.latency_ms.items()},
            "tcp_sent_bps": _round(self.tcp_sent_bps),
            "tcp_received_bps": _round(self.tcp_received_bps),
            "mtls": self.mtls,
            "mtls_share": None if self.mtls_share is None else _round(self.mtls_share),
        }


@dataclass(frozen=True, slots=True)
class Graph:
    interval: float  # seconds between the two snapshots (the longest target interval)
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    errors: Mapping[str, str] = field(default_factory=dict)  # targets that could not be read

    def node(self, node_id: str) -> Node | None:
        return next((n for n in self.nodes if n.id == node_id), None)

    def edge(self, edge_id: str) -> Edge | None:
        return next((e for e in self.edges if e.id == edge_id), None)

    def as_json(self) -> dict[str, object]:
        namespaces = sorted({n.namespace for n in self.nodes if n.namespace})
        inbound: dict[str, list[Edge]] = {}
        outbound: dict[str, list[Edge]] = {}
        for e in self.edges:
            inbound.setdefault(e.target, []).append(e)
            outbound.setdefault(e.source, []).append(e)
        nodes = []
        for n in self.nodes:
            ins = inbound.get(n.id, [])
            rps_in = sum(e.rps for e in ins)
            errors_in = sum(e.rps * (e.error_rate or 0.0) for e in ins)
            nodes.append(
                {
                    **n.as_json(),
                    "rps_in": _round(rps_in),
                    "rps_out": _round(sum(e.rps for e in outbound.get(n.id, []))),
                    "error_rate_in": _round(errors_in / rps_in) if rps_in > 0 else None,
                }
            )
        return {
            "interval": _round(self.interval),
            "namespaces": namespaces,
            "nodes": nodes,
            "edges": [e.as_json() for e in self.edges],
            "errors": dict(sorted(self.errors.items())),
        }


def _round(value: float) -> float:
    return round(value, 4)


class _Acc:
    """What one reporter said about one edge, summed over its series."""

    __slots__ = ("buckets", "codes", "protocols", "received", "requests", "secure", "sent")

    def __init__(self) -> None:
        self.requests = 0.0
        self.codes: dict[str, float] = {}
        self.buckets: dict[float, float] = {}
        self.sent = 0.0
        self.received = 0.0
        # Mutual-TLS part of the traffic: [requests, bytes].
        self.secure = [0.0, 0.0]
        self.protocols: set[str] = set()

    @property
    def active(self) -> bool:
        return self.requests > 0 or self.sent > 0 or self.received > 0

    def edge(self, source: str, target: str, reporter: str) -> Edge:
        errors = sum(r for c, r in self.codes.items() if c.startswith("5"))
        error_rate = errors / self.requests if self.requests > 0 else None
        latency = {k: histogram_quantile(q, self.buckets) for k, q in QUANTILES}
        share: float | None = None
        if reporter == "destination":
            if self.requests > 0:
                share = min(1.0, self.secure[0] / self.requests)
            elif self.sent + self.received > 0:
                share = min(1.0, self.secure[1] / (self.sent + self.received))
        protocols = self.protocols - {"tcp"} if self.requests > 0 else self.protocols
        return Edge(
            source=source,
            target=target,
            reporter=reporter,
            protocol=",".join(sorted(protocols)) or ("http" if self.requests else "tcp"),
            rps=self.requests,
            error_rate=error_rate,
            codes=dict(self.codes),
            latency_ms=latency,
            tcp_sent_bps=self.sent,
            tcp_received_bps=self.received,
            mtls_share=share,
        )


def series_rates(old: Snapshot, new: Snapshot) -> Iterator[tuple[Sample, float, float]]:
    """(sample, increase per second, interval) of every series of a target read in both
    snapshots (0 when its counter did not move). A target missing from `old` gives nothing
    (its counters' start is unknown); a series missing from `old` of a target that was read
    started since, from 0; a counter lower than before was reset, and its new value is the
    increase."""
    for target, now in new.targets.items():
        before = old.targets.get(target)
        if before is None:
            continue
        dt = now.at - before.at
        if dt <= 0:
            continue
        previous = {s.key: s.value for s in before.samples}
        for s in now.samples:
            p = previous.get(s.key, 0.0)
            increase = s.value - p if s.value >= p else s.value
            yield s, increase / dt, dt


def _service_node(labels: Mapping[str, str]) -> Node | None:
    host = labels.get("destination_service", "")
    if not host or host == UNKNOWN:
        return None
    name = labels.get("destination_service_name", "")
    namespace = labels.get("destination_service_namespace", "")
    parts = host.split(".")
    if not name or name == UNKNOWN:
        name = parts[0]
    if (not namespace or namespace == UNKNOWN) and len(parts) > 2 and parts[2] == "svc":
        namespace = parts[1]
    return Node(f"svc:{host}", "service", "" if namespace == UNKNOWN else namespace, name)


def _workload_node(labels: Mapping[str, str], side: str) -> Node:
    name = labels.get(f"{side}_workload", "")
    namespace = labels.get(f"{side}_workload_namespace", "")
    if not name or name == UNKNOWN:
        return Node(UNKNOWN, UNKNOWN, "", UNKNOWN)
    app = labels.get(f"{side}_app", "")
    return Node(
        f"wl:{namespace}/{name}", "workload", namespace, name, "" if app == UNKNOWN else app
    )


def build_graph(old: Snapshot, new: Snapshot, extra_nodes: Iterable[Node] = ()) -> Graph:
    """The graph of the traffic between `old` and `new`; `extra_nodes` (services and
    workloads known from config) are shown even when idle."""
    nodes: dict[str, Node] = {n.id: n for n in extra_nodes}
    seen: dict[str, Node] = {}  # every node a series names; kept when an edge uses it
    # reporter -> (source id, target id) -> what it said
    reports: dict[str, dict[tuple[str, str], _Acc]] = {"destination": {}, "source": {}}
    interval = 0.0
    for s, rate, dt in series_rates(old, new):
        labels = dict(s.labels)
        by_edge = reports.get(labels.get("reporter", ""))
        # Buckets that did not move still bound the quantile; other idle series add nothing.
        if by_edge is None or (rate <= 0 and s.name != DURATION_BUCKET):
            continue
        interval = max(interval, dt)
        src = _workload_node(labels, "source")
        svc = _service_node(labels)
        dst = _workload_node(labels, "destination")
        hops: list[tuple[Node, Node]] = []
        if svc is not None:
            hops.append((src, svc))
            if dst.kind != UNKNOWN:
                hops.append((svc, dst))
        elif dst.kind != UNKNOWN:
            hops.append((src, dst))
        secure = labels.get("connection_security_policy") == "mutual_tls"
        for a, b in hops:
            seen.setdefault(a.id, a)
            seen.setdefault(b.id, b)
            acc = by_edge.get((a.id, b.id))
            if acc is None:
                acc = by_edge[(a.id, b.id)] = _Acc()
            _add(acc, s, labels, rate, secure)
    edges: list[Edge] = []
    for key in sorted(reports["destination"].keys() | reports["source"].keys()):
        dest = reports["destination"].get(key)
        reporter = "destination" if dest is not None and dest.active else "source"
        acc = reports[reporter].get(key)
        if acc is None or not acc.active:
            continue
        edges.append(acc.edge(key[0], key[1], reporter))
        for node_id in key:
            nodes.setdefault(node_id, seen[node_id])
    return Graph(
        interval,
        tuple(sorted(nodes.values(), key=lambda n: (n.namespace, n.kind, n.name, n.id))),
        tuple(edges),
        dict(new.errors),
    )


def _add(acc: _Acc, s: Sample, labels: Mapping[str, str], rate: float, secure: bool) -> None:
    if s.name == REQUESTS:
        acc.requests += rate
        code = labels.get("response_code", "") or "0"
        acc.codes[code] = acc.codes.get(code, 0.0) + rate
        if secure:
            acc.secure[0] += rate
        protocol = labels.get("request_protocol", "")
        if protocol and protocol != UNKNOWN:
            acc.protocols.add(protocol)
    elif s.name == DURATION_BUCKET:
        le = _bound(labels.get("le", ""))
        if le is not None:
            acc.buckets[le] = acc.buckets.get(le, 0.0) + rate
    elif s.name in (TCP_SENT, TCP_RECEIVED):
        if s.name == TCP_SENT:
            acc.sent += rate
        else:
            acc.received += rate
        if secure:
            acc.secure[1] += rate
        acc.protocols.add("tcp")


def _bound(text: str) -> float | None:
    try:
        value = float(text)  # "+Inf" parses as inf
    except ValueError:
        return None
    return None if math.isnan(value) else value


def only_namespaces(graph: Graph, namespaces: frozenset[str]) -> Graph:
    """The part of `graph` that touches `namespaces`: their nodes, the edges from or to them,
    and the nodes at the other end of those edges."""
    inside = {n.id for n in graph.nodes if n.namespace in namespaces}
    edges = tuple(e for e in graph.edges if e.source in inside or e.target in inside)
    keep = inside | {e.source for e in edges} | {e.target for e in edges}
    return Graph(graph.interval, tuple(n for n in graph.nodes if n.id in keep), edges, graph.errors)
