"""Metric samples as the graph builder reads them: the Istio standard metrics of one scrape
target at one instant.

A `Snapshot` holds every target seen at one round of reading (an agent's status port, or one
Prometheus `instance`), each with the time it was read, so rates are taken per target over
that target's own interval.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# The Istio standard metrics the graph is built from; every other series is dropped at parse
# time (an agent's /stats/prometheus carries thousands of Envoy stats besides these).
REQUESTS = "istio_requests_total"
DURATION_BUCKET = "istio_request_duration_milliseconds_bucket"
TCP_SENT = "istio_tcp_sent_bytes_total"
TCP_RECEIVED = "istio_tcp_received_bytes_total"
GRAPH_METRICS = frozenset({REQUESTS, DURATION_BUCKET, TCP_SENT, TCP_RECEIVED})

# Labels, sorted by name: the identity of a series together with its metric name.
LabelSet = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: LabelSet
    value: float

    def label(self, key: str, default: str = "") -> str:
        for k, v in self.labels:
            if k == key:
                return v
        return default

    @property
    def key(self) -> tuple[str, LabelSet]:
        return (self.name, self.labels)


def sample(name: str, labels: Mapping[str, str], value: float) -> Sample:
    return Sample(name, tuple(sorted(labels.items())), float(value))


# The labels that tell one series of a flow from another; the rest name the flow.
_PER_SERIES = frozenset({"response_code", "le"})


class FlowCounters:
    """One flow's counters at one instant, as one target reported them: every series whose
    labels differ only in `response_code` or `le` (the request counters by code, the
    duration buckets) folded together, so a graph is built per flow, not per series."""

    __slots__ = ("bounds", "buckets", "codes", "received", "sent")

    def __init__(self) -> None:
        self.codes: dict[str, float] = {}  # response code -> requests
        # Duration buckets as two vectors: upper bounds, ascending (`+Inf` last), and the
        # cumulative count of each; vectors, because the graph subtracts and adds them.
        self.bounds: tuple[float, ...] = ()
        self.buckets: tuple[float, ...] = ()
        self.sent = 0.0
        self.received = 0.0


def flow_key(labels: LabelSet) -> LabelSet:
    return tuple(kv for kv in labels if kv[0] not in _PER_SERIES)


def aggregate(samples: Iterable[Sample]) -> dict[LabelSet, FlowCounters]:
    flows: dict[LabelSet, FlowCounters] = {}
    buckets: dict[LabelSet, dict[float, float]] = {}
    for s in samples:
        key = flow_key(s.labels)
        counters = flows.get(key)
        if counters is None:
            counters = flows[key] = FlowCounters()
        if s.name == REQUESTS:
            code = s.label("response_code") or "0"
            counters.codes[code] = counters.codes.get(code, 0.0) + s.value
        elif s.name == DURATION_BUCKET:
            try:
                le = float(s.label("le"))  # "+Inf" parses as inf
            except ValueError:
                continue
            if not math.isnan(le):
                by_bound = buckets.setdefault(key, {})
                by_bound[le] = by_bound.get(le, 0.0) + s.value
        elif s.name == TCP_SENT:
            counters.sent += s.value
        elif s.name == TCP_RECEIVED:
            counters.received += s.value
    layouts: dict[tuple[float, ...], tuple[float, ...]] = {}  # one bounds tuple per layout
    for key, by_bound in buckets.items():
        bounds = tuple(sorted(by_bound))
        counters = flows[key]
        counters.bounds = layouts.setdefault(bounds, bounds)
        counters.buckets = tuple(by_bound[b] for b in bounds)
    return flows


@dataclass(frozen=True, slots=True)
class TargetSamples:
    at: float  # when this target was read (seconds, the reader's clock)
    flows: Mapping[LabelSet, FlowCounters]

    @classmethod
    def of(cls, at: float, samples: Iterable[Sample]) -> TargetSamples:
        return cls(at, aggregate(samples))


@dataclass(frozen=True, slots=True)
class Snapshot:
    at: float  # when the round of reading finished
    targets: Mapping[str, TargetSamples] = field(default_factory=dict)
    # Targets that could not be read this round, with a one-line reason (shown in the page).
    errors: Mapping[str, str] = field(default_factory=dict)
