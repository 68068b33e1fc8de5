"""A histogram for the push hot path.

prometheus_client's Histogram takes a lock and walks its buckets on every observation, a few
microseconds each; a push to a thousand streams observes several times per stream (push time,
send time, queue time, convergence at the ACK), which added up to a visible share of a push.
The control plane records on its event loop only, so this one keeps plain counters per bucket
(found by bisection) and builds the samples when scraped. It renders as prometheus_client's
does: cumulative `_bucket{le=…}`, `_count`, `_sum`.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


class HistogramChild:
    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # Prometheus buckets are `le`: a value equal to a bound is counted in that bucket.
        self.counts[bisect.bisect_left(self._bounds, value)] += 1
        self.sum += value


class LoopHistogram(Collector):
    """Not thread-safe: observe from the event loop only (scrapes are served there too)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._bounds = tuple(sorted(float(b) for b in buckets))
        # As prometheus_client spells `le` (its helper is untyped).
        self._les = [floatToGoString(b) for b in self._bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        self._children: dict[tuple[str, ...], HistogramChild] = {}
        if not self._labelnames:
            self._children[()] = HistogramChild(self._bounds)
        registry.register(self)

    def labels(self, *values: str) -> HistogramChild:
        assert len(values) == len(self._labelnames), (self._name, values)
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = HistogramChild(self._bounds)
        return child

    def observe(self, value: float) -> None:
        self._children[()].observe(value)

    def describe(self) -> Iterable[Metric]:
        return [HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)]

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)
        for values, child in sorted(self._children.items()):
            total = 0
            buckets: list[tuple[str, float]] = []
            for le, n in zip(self._les, child.counts, strict=True):
                total += n
                buckets.append((le, total))
            family.add_metric(list(values), buckets, child.sum)
        return [family]
