"""Metric samples as the graph builder reads them: the Istio standard metrics of one scrape
target at one instant.

A `Snapshot` holds every target seen at one round of reading (an agent's status port, or one
Prometheus `instance`), each with the time it was read, so rates are taken per target over
that target's own interval.
"""

from __future__ import annotations

from collections.abc import Mapping
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


@dataclass(frozen=True, slots=True)
class TargetSamples:
    at: float  # when this target was read (seconds, the reader's clock)
    samples: tuple[Sample, ...]


@dataclass(frozen=True, slots=True)
class Snapshot:
    at: float  # when the round of reading finished
    targets: Mapping[str, TargetSamples] = field(default_factory=dict)
    # Targets that could not be read this round, with a one-line reason (shown in the page).
    errors: Mapping[str, str] = field(default_factory=dict)
