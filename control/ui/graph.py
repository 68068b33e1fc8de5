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
server's (`reporter="destination"`). An edge's numbers are the caller's report when there is
one (it counts requests that never reached the server: an injected fault, an open circuit
breaker) and the server's otherwise (a caller without a sidecar), never both, as Kiali does;
its mTLS share is always the server's (a caller reports `connection_security_policy`
"unknown").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field

from control.ui.quantile import histogram_quantiles
from control.ui.samples import FlowCounters, LabelSet, Snapshot

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
        return asdict(self)


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
    mtls_share: float | None  # None: no server report (only the server sees its TLS)

    @property
    def id(self) -> str:
        return f"{self.source}>{self.target}"

    @property
    def mtls(self) -> bool | None:
        """True when all of the traffic was mutual TLS, False when not all of it was, None
        without a server report (a caller does not see the server's TLS)."""
        return None if self.mtls_share is None else self.mtls_share >= 0.999

    def summary_json(self) -> dict[str, object]:
        """What the graph view draws (every edge of the mesh is in one answer, so only
        that: the response codes, p50/p90 and who reported it are in the edge's details)."""
        p99 = self.latency_ms["p99"]
        return {**self._numbers_json(), "p99_ms": None if p99 is None else _round(p99)}

    def as_json(self) -> dict[str, object]:
        return {
            **self._numbers_json(),
            "reporter": self.reporter,
            "codes": {c: _round(r) for c, r in sorted(self.codes.items())},
            "latency_ms": {k: None if v is None else _round(v) for k, v in self.latency_ms.items()},
            "mtls_share": None if self.mtls_share is None else _round(self.mtls_share),
        }

    def _numbers_json(self) -> dict[str, object]:
        """The part both the summary and the details show."""
        return {
            "id": self.id,
            "source": self.source,
            "target": self.target,
            "protocol": self.protocol,
            "rps": _round(self.rps),
            "error_rate": None if self.error_rate is None else _round(self.error_rate),
            "tcp_sent_bps": _round(self.tcp_sent_bps),
            "tcp_received_bps": _round(self.tcp_received_bps),
            "mtls": self.mtls,
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
        nodes = [_node_json(n, inbound.get(n.id, []), outbound.get(n.id, [])) for n in self.nodes]
        return {
            "interval": _round(self.interval),
            "namespaces": namespaces,
            "nodes": nodes,
            "edges": [e.summary_json() for e in self.edges],
            "errors": dict(sorted(self.errors.items())),
        }


def node_summary(
    graph: Graph, node_id: str
) -> tuple[dict[str, object] | None, list[Edge], list[Edge]]:
    """One node as the graph's JSON shows it, with its inbound and outbound edges."""
    ins = [e for e in graph.edges if e.target == node_id]
    outs = [e for e in graph.edges if e.source == node_id]
    node = graph.node(node_id)
    return (None if node is None else _node_json(node, ins, outs)), ins, outs


def _node_json(n: Node, ins: list[Edge], outs: list[Edge]) -> dict[str, object]:
    rps_in = sum(e.rps for e in ins)
    errors_in = sum(e.rps * (e.error_rate or 0.0) for e in ins)
    return {
        **n.as_json(),
        "rps_in": _round(rps_in),
        "rps_out": _round(sum(e.rps for e in outs)),
        "error_rate_in": _round(errors_in / rps_in) if rps_in > 0 else None,
    }


def _round(value: float) -> float:
    return round(value, 4)


class _Acc:
    """What one reporter said about one edge, summed over its series."""

    __slots__ = (
        "bounds",
        "buckets",
        "codes",
        "protocols",
        "received",
        "requests",
        "secure",
        "sent",
    )

    def __init__(self) -> None:
        self.requests = 0.0
        self.codes: dict[str, float] = {}
        self.bounds: tuple[float, ...] = ()
        self.buckets: list[float] = []
        self.sent = 0.0
        self.received = 0.0
        # Mutual-TLS part of the traffic: [requests, bytes].
        self.secure = [0.0, 0.0]
        self.protocols: set[str] = set()

    @property
    def active(self) -> bool:
        return self.requests > 0 or self.sent > 0 or self.received > 0

    def add(self, flow: _Flow, rates: FlowRates, requests: float) -> None:
        if requests > 0:
            self.requests += requests
            for code, rate in rates.codes.items():
                self.codes[code] = self.codes.get(code, 0.0) + rate
            if flow.secure:
                self.secure[0] += requests
            if flow.protocol:
                self.protocols.add(flow.protocol)
        if rates.bounds:
            if not self.bounds:
                self.bounds = rates.bounds
                self.buckets = list(rates.buckets)
            elif self.bounds == rates.bounds:
                self.buckets = [a + b for a, b in zip(self.buckets, rates.buckets, strict=True)]
            else:  # flows with other bucket layouts: merged bound by bound
                merged = dict(zip(self.bounds, self.buckets, strict=True))
                for le, rate in zip(rates.bounds, rates.buckets, strict=True):
                    merged[le] = merged.get(le, 0.0) + rate
                self.bounds = tuple(sorted(merged))
                self.buckets = [merged[b] for b in self.bounds]
        tcp = rates.sent + rates.received
        if tcp > 0:
            self.sent += rates.sent
            self.received += rates.received
            if flow.secure:
                self.secure[1] += tcp
            self.protocols.add("tcp")

    def mtls_share(self) -> float | None:
        """The mutual-TLS part of the traffic (requests, else bytes); a server's report."""
        if self.requests > 0:
            return min(1.0, self.secure[0] / self.requests)
        if self.sent + self.received > 0:
            return min(1.0, self.secure[1] / (self.sent + self.received))
        return None

    def edge(self, source: str, target: str, reporter: str, share: float | None) -> Edge:
        errors = sum(r for c, r in self.codes.items() if c.startswith("5"))
        error_rate = errors / self.requests if self.requests > 0 else None
        values = histogram_quantiles([q for _, q in QUANTILES], self.bounds, self.buckets)
        latency = {k: v for (k, _), v in zip(QUANTILES, values, strict=True)}
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


class FlowRates:
    """One flow's increase per second over the window, as one target reported it."""

    __slots__ = ("bounds", "buckets", "codes", "received", "sent")

    def __init__(self) -> None:
        self.codes: dict[str, float] = {}
        self.bounds: tuple[float, ...] = ()
        self.buckets: list[float] = []
        self.sent = 0.0
        self.received = 0.0

    @property
    def active(self) -> bool:
        return any(self.codes.values()) or self.sent > 0 or self.received > 0


def _increase(new: float, old: float) -> float:
    # A counter lower than before was reset; its new value is what it counted since.
    return new - old if new >= old else new


def flow_rates(old: Snapshot, new: Snapshot) -> Iterator[tuple[LabelSet, FlowRates, float]]:
    """(flow labels, increase per second, interval) of every flow of a target read in both
    snapshots. A target missing from `old` gives nothing (its counters' start is unknown); a
    flow or a counter missing from `old` of a target that was read started since, from 0."""
    empty = FlowCounters()
    for target, now in new.targets.items():
        before = old.targets.get(target)
        if before is None:
            continue
        dt = now.at - before.at
        if dt <= 0:
            continue
        for key, counters in now.flows.items():
            prev = before.flows.get(key, empty)
            rates = FlowRates()
            for code, value in counters.codes.items():
                rates.codes[code] = _increase(value, prev.codes.get(code, 0.0)) / dt
            if counters.bounds:
                if not prev.bounds:
                    rates.bounds = counters.bounds
                    rates.buckets = [v / dt for v in counters.buckets]
                elif prev.bounds == counters.bounds:
                    rates.bounds = counters.bounds
                    rates.buckets = [
                        (n - o if n >= o else n) / dt
                        for n, o in zip(counters.buckets, prev.buckets, strict=True)
                    ]
                # else: the bucket layout changed; no latency for this window.
            rates.sent = _increase(counters.sent, prev.sent) / dt
            rates.received = _increase(counters.received, prev.received) / dt
            yield key, rates, dt


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


@dataclass(frozen=True, slots=True)
class _Flow:
    """What a flow's labels say: who reported it and the edges it counts for."""

    reporter: str
    hops: tuple[tuple[str, str], ...]
    nodes: tuple[Node, ...]
    secure: bool
    protocol: str


def _resolve(labels: LabelSet) -> _Flow:
    d = dict(labels)
    src = _workload_node(d, "source")
    svc = _service_node(d)
    dst = _workload_node(d, "destination")
    hops: list[tuple[Node, Node]] = []
    if svc is not None:
        hops.append((src, svc))
        if dst.kind != UNKNOWN:
            hops.append((svc, dst))
    elif dst.kind != UNKNOWN:
        hops.append((src, dst))
    protocol = d.get("request_protocol", "")
    return _Flow(
        reporter=d.get("reporter", ""),
        hops=tuple((a.id, b.id) for a, b in hops),
        nodes=tuple(n for hop in hops for n in hop),
        secure=d.get("connection_security_policy") == "mutual_tls",
        protocol="" if protocol == UNKNOWN else protocol,
    )


class FlowCache:
    """Flow labels → what they say. A flow keeps its labels from scrape to scrape, so
    reading them is paid once per flow rather than once per graph. Bounded: past `limit`
    it starts over."""

    def __init__(self, limit: int = 200_000) -> None:
        self._flows: dict[LabelSet, _Flow] = {}
        self._limit = limit

    def flow(self, labels: LabelSet) -> _Flow:
        found = self._flows.get(labels)
        if found is None:
            if len(self._flows) >= self._limit:
                self._flows.clear()
            found = self._flows[labels] = _resolve(labels)
        return found


def build_graph(
    old: Snapshot,
    new: Snapshot,
    extra_nodes: Iterable[Node] = (),
    flows: FlowCache | None = None,
) -> Graph:
    """The graph of the traffic between `old` and `new`; `extra_nodes` (services and
    workloads known from config) are shown even when idle; `flows` carries what flow labels
    say from one build to the next."""
    flows = flows or FlowCache()
    nodes: dict[str, Node] = {n.id: n for n in extra_nodes}
    seen: dict[str, Node] = {}  # every node a flow names; kept when an edge uses it
    # reporter -> (source id, target id) -> what it said
    reports: dict[str, dict[tuple[str, str], _Acc]] = {"destination": {}, "source": {}}
    interval = 0.0
    for labels, rates, dt in flow_rates(old, new):
        if not rates.active:
            continue  # idle: its buckets did not move either
        flow = flows.flow(labels)
        by_edge = reports.get(flow.reporter)
        if by_edge is None:
            continue
        if dt > interval:
            interval = dt
        for n in flow.nodes:
            if n.id not in seen:
                seen[n.id] = n
        requests = sum(rates.codes.values())
        for hop in flow.hops:
            acc = by_edge.get(hop)
            if acc is None:
                acc = by_edge[hop] = _Acc()
            acc.add(flow, rates, requests)
    edges: list[Edge] = []
    for key in sorted(reports["destination"].keys() | reports["source"].keys()):
        caller = reports["source"].get(key)
        server = reports["destination"].get(key)
        # The caller's report counts every request, also those that never reached the
        # server (fault injection, circuit breaking, no route); the server's stands in for
        # callers without a sidecar, and only the server knows whether TLS was mutual.
        if caller is not None and caller.active:
            acc, reporter = caller, "source"
        elif server is not None and server.active:
            acc, reporter = server, "destination"
        else:
            continue
        share = server.mtls_share() if server is not None and server.active else None
        edges.append(acc.edge(key[0], key[1], reporter, share))
        for node_id in key:
            nodes.setdefault(node_id, seen[node_id])
    return Graph(
        interval,
        tuple(sorted(nodes.values(), key=lambda n: (n.namespace, n.kind, n.name, n.id))),
        tuple(edges),
        dict(new.errors),
    )


def only_namespaces(graph: Graph, namespaces: frozenset[str]) -> Graph:
    """The part of `graph` that touches `namespaces`: their nodes, the edges from or to them,
    and the nodes at the other end of those edges."""
    inside = {n.id for n in graph.nodes if n.namespace in namespaces}
    edges = tuple(e for e in graph.edges if e.source in inside or e.target in inside)
    keep = inside | {e.source for e in edges} | {e.target for e in edges}
    return Graph(graph.interval, tuple(n for n in graph.nodes if n.id in keep), edges, graph.errors)
