"""The Telemetry API's metric overrides, applied to the standard metrics (sans-IO).

The control plane resolves a proxy's Telemetry `metrics[].overrides` per side and writes the
result into the side's access loggers as the literal tag `TAG_OVERRIDES` (protos/telemetry.py
has the encoding), next to the proxy's own workload tags. So every entry says which overrides
its side is under, and a Telemetry change reaches a connected proxy with its listeners.

Two places use them:

- Recording (`SideOverrides.fold_http` / `fold_tcp`): a label that every enabled metric of the
  family drops is recorded as `unknown`, so dropping a high-cardinality label also saves the
  agent's memory (and its label-set cap). `http_off` / `tcp_off`: nothing of the family is
  exported, nothing is recorded.
- Exporting (`apply`): per sample, the overrides last carried by its reporter's entries:
  a disabled metric's samples are left out, removed labels are taken off and the samples
  that then share their labels are summed (counters, histogram buckets, sums and counts all
  add up). A change therefore shows at the next scrape, counts from before it included.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Final

from envoy.data.accesslog.v3.accesslog_pb2 import AccessLogCommon

from agent.telemetry.labels import HTTP_LABELS, TCP_LABELS, UNKNOWN, LabelValues
from protos import telemetry as t

if TYPE_CHECKING:  # the families come from a scrape: prometheus_client is loaded by then
    from prometheus_client.metrics_core import Metric
    from prometheus_client.samples import Sample

logger = logging.getLogger(__name__)

# The aggregator's family names (prometheus_client's, without `_total`) to Istio's metrics.
FAMILY_METRIC: Final = {
    "istio_requests": "REQUEST_COUNT",
    "istio_request_duration_milliseconds": "REQUEST_DURATION",
    "istio_request_bytes": "REQUEST_SIZE",
    "istio_response_bytes": "RESPONSE_SIZE",
    "istio_tcp_sent_bytes": "TCP_SENT_BYTES",
    "istio_tcp_received_bytes": "TCP_RECEIVED_BYTES",
    "istio_tcp_connections_opened": "TCP_OPENED_CONNECTIONS",
    "istio_tcp_connections_closed": "TCP_CLOSED_CONNECTIONS",
}
REPORTER: Final = "reporter"


@dataclass(frozen=True, slots=True)
class SideOverrides:
    """The overrides one side (reporter) of the proxy is under."""

    disabled: frozenset[str] = frozenset()
    removed: tuple[tuple[str, frozenset[str]], ...] = ()  # (metric, labels), by metric
    http_fold: tuple[int, ...] = field(default=(), compare=False)
    tcp_fold: tuple[int, ...] = field(default=(), compare=False)
    http_off: bool = field(default=False, compare=False)
    tcp_off: bool = field(default=False, compare=False)

    def removed_for(self, metric: str) -> frozenset[str]:
        for m, labels in self.removed:
            if m == metric:
                return labels
        return frozenset()

    def fold_http(self, values: LabelValues) -> LabelValues:
        return _fold(values, self.http_fold) if self.http_fold else values

    def fold_tcp(self, values: LabelValues) -> LabelValues:
        return _fold(values, self.tcp_fold) if self.tcp_fold else values


NO_OVERRIDES: Final = SideOverrides()


def side_overrides(
    disabled: frozenset[str], removed: Mapping[str, frozenset[str]]
) -> SideOverrides:
    # `le` is the histograms' own label, not one of Istio's tags.
    pairs = tuple(sorted((m, labels - {"le"}) for m, labels in removed.items() if labels - {"le"}))
    if not disabled and not pairs:
        return NO_OVERRIDES
    partial = SideOverrides(disabled, pairs)
    http_fold, http_off = _family(partial, t.HTTP_METRICS, HTTP_LABELS)
    tcp_fold, tcp_off = _family(partial, t.TCP_METRICS, TCP_LABELS)
    return SideOverrides(disabled, pairs, http_fold, tcp_fold, http_off, tcp_off)


def _family(
    side: SideOverrides, metrics: tuple[str, ...], names: tuple[str, ...]
) -> tuple[tuple[int, ...], bool]:
    """The label positions every enabled metric of the family removes, and whether none is
    enabled. The reporter stays: recording and exporting key on it."""
    enabled = [m for m in metrics if m not in side.disabled]
    if not enabled:
        return (), True
    common = frozenset.intersection(*(side.removed_for(m) for m in enabled))
    return tuple(i for i, n in enumerate(names) if n in common and n != REPORTER), False


def _fold(values: LabelValues, positions: tuple[int, ...]) -> LabelValues:
    out = list(values)
    for i in positions:
        out[i] = UNKNOWN
    return tuple(out)


def of_entry(common: AccessLogCommon) -> SideOverrides:
    """The overrides an entry's logger carries (none without the tag)."""
    value = common.custom_tags.get(t.TAG_OVERRIDES)
    return parse(value) if value else NO_OVERRIDES


@lru_cache(maxsize=64)
def parse(value: str) -> SideOverrides:
    """A `TAG_OVERRIDES` value; a malformed one (the control plane wrote it, so a bug or a
    different version) is reported once and means no overrides: metrics stay as Istio's."""
    decoded = t.decode_overrides(value)
    if decoded is None:
        logger.warning("ignoring malformed metric overrides tag %.200r", value)
        return NO_OVERRIDES
    return side_overrides(*decoded)


def apply(families: Iterable[Metric], sides: Mapping[str, SideOverrides]) -> Iterator[Metric]:
    """`families` with each sample under its reporter's overrides (see the module doc)."""
    for family in families:
        metric = FAMILY_METRIC.get(family.name)
        if metric is None or all(s is NO_OVERRIDES for s in sides.values()):
            yield family
            continue
        merged: dict[tuple[str, tuple[tuple[str, str], ...]], Sample] = {}
        for sample in family.samples:
            side = sides.get(sample.labels.get(REPORTER, ""), NO_OVERRIDES)
            if metric in side.disabled:
                continue
            removed = side.removed_for(metric)
            labels = (
                {k: v for k, v in sample.labels.items() if k not in removed}
                if removed
                else sample.labels
            )
            key = (sample.name, tuple(labels.items()))
            found = merged.get(key)
            if found is None:
                merged[key] = sample._replace(labels=labels)
            else:
                merged[key] = found._replace(value=found.value + sample.value)
        family.samples = list(merged.values())
        yield family
