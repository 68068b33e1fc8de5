"""A histogram and a counter for the push hot path.

prometheus_client's Histogram and Counter take a lock on every observation (the histogram
also walks its buckets); a push to a thousand streams observes several times per stream
(push time, send time, queue time, convergence at the ACK, the push count), which added up
to a visible share of a push. The control plane records on its event loop only, so these
keep plain numbers per series (a histogram's bucket found by bisection) and build the samples
when scraped, rendered as prometheus_client renders them: a histogram's cumulative
`_bucket{le=…}`, `_count` and `_sum`; a counter's `<name>_total` (control/promtext.py drops
the suffix as istiod does). Not thread-safe: record from the event loop only (scrapes are
served there too).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
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


class CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        self.value += amount


_Child = TypeVar("_Child", HistogramChild, CounterChild)


class _LoopFamily(Collector, Generic[_Child]):
    """The series of one metric by label values, registered as a collector."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry,
        new_child: Callable[[], _Child],
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._new_child: Callable[[], _Child] = new_child
        self._children: dict[tuple[str, ...], _Child] = {}
        if not self._labelnames:
            self._children[()] = new_child()
        registry.register(self)

    def labels(self, *values: str) -> _Child:
        assert len(values) == len(self._labelnames), (self._name, values)
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._new_child()
        return child

    def _series(self) -> list[tuple[tuple[str, ...], _Child]]:
        return sorted(self._children.items(), key=lambda item: item[0])


class LoopHistogram(_LoopFamily[HistogramChild]):
    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self._bounds = tuple(sorted(float(b) for b in buckets))
        # As prometheus_client spells `le` (its helper is untyped).
        self._les = [floatToGoString(b) for b in self._bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        bounds = self._bounds
        super().__init__(name, documentation, labelnames, registry, lambda: HistogramChild(bounds))

    def observe(self, value: float) -> None:
        self._children[()].observe(value)

    def describe(self) -> Iterable[Metric]:
        return [HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)]

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)
        for values, child in self._series():
            total = 0
            buckets: list[tuple[str, float]] = []
            for le, n in zip(self._les, child.counts, strict=True):
                total += n
                buckets.append((le, total))
            family.add_metric(list(values), buckets, child.sum)
        return [family]


class LoopCounter(_LoopFamily[CounterChild]):
    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: CollectorRegistry,
    ) -> None:
        # Named as prometheus_client names a counter's family: without the suffix.
        super().__init__(
            name.removesuffix("_total"), documentation, labelnames, registry, CounterChild
        )

    def inc(self, amount: float = 1) -> None:
        self._children[()].inc(amount)

    def describe(self) -> Iterable[Metric]:
        return [CounterMetricFamily(self._name, self._documentation, labels=self._labelnames)]

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(self._name, self._documentation, labels=self._labelnames)
        for values, child in self._series():
            family.add_metric(list(values), child.value)
        return [family]
