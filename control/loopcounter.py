"""A counter for the push hot path.

prometheus_client's Counter takes a lock on every increment; `pilot_xds_pushes` is counted
once per response written, so a push to a thousand streams paid that a thousand times (about
a microsecond and a half each, a tenth of the push's own work per stream). The control plane
counts on its event loop only, so this one keeps a plain number per series and builds the
samples when scraped, rendered as prometheus_client renders a counter (`<name>_total`;
control/promtext.py drops the suffix as istiod does).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector


class CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        self.value += amount


class LoopCounter(Collector):
    """Not thread-safe: count from the event loop only (scrapes are served there too)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: CollectorRegistry,
    ) -> None:
        # Named as prometheus_client names a counter's family: without the suffix.
        self._name = name.removesuffix("_total")
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], CounterChild] = {}
        if not self._labelnames:
            self._children[()] = CounterChild()
        registry.register(self)

    def labels(self, *values: str) -> CounterChild:
        assert len(values) == len(self._labelnames), (self._name, values)
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = CounterChild()
        return child

    def inc(self, amount: float = 1) -> None:
        self._children[()].inc(amount)

    def describe(self) -> Iterable[Metric]:
        return [CounterMetricFamily(self._name, self._documentation, labels=self._labelnames)]

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(self._name, self._documentation, labels=self._labelnames)
        for values, child in sorted(self._children.items()):
            family.add_metric(list(values), child.value)
        return [family]
