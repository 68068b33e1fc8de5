"""Prometheus text exposition with Istio's spelling of counters.

istiod exports its counters without prometheus_client's `_total` suffix and without
`_created` series (its exporter runs with counter suffixes off): `pilot_xds_pushes`,
`citadel_server_csr_count`. Dashboards and alerts written for Istio query those exact names,
so the control plane renders its own registry the same way. Process metrics
(`process_cpu_seconds_total`, …) keep the standard names, as istiod's do.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

# Istio counters whose own name ends in `_total` (its sidecar injection counters): the
# suffix is part of the name there, so it stays.
KEEP_TOTAL = frozenset(
    (
        "sidecar_injection_requests",
        "sidecar_injection_success",
        "sidecar_injection_skip",
        "sidecar_injection_failure",
    )
)


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


def _without_created(family: Metric) -> Metric:
    out = Metric(family.name, family.documentation, family.type, family.unit)
    out.samples = [s for s in family.samples if not s.name.endswith("_created")]
    return out


def _counter_as_istio(family: Metric) -> bytes:
    """A counter family rendered under its bare name: rendered as a gauge of that name (the
    exposition of the samples is the same) with the TYPE line put back to counter."""
    name = family.name
    gauge = Metric(name, family.documentation, "gauge")
    gauge.samples = [s._replace(name=name) for s in family.samples if s.name == name + "_total"]
    text = generate_latest(_Families((gauge,)))
    return text.replace(f"# TYPE {name} gauge\n".encode(), f"# TYPE {name} counter\n".encode(), 1)


def istio_exposition(registry: CollectorRegistry) -> bytes:
    parts: list[bytes] = []
    plain: list[Metric] = []
    for family in registry.collect():
        if family.type == "counter" and family.name not in KEEP_TOTAL:
            if plain:
                parts.append(generate_latest(_Families(plain)))
                plain = []
            parts.append(_counter_as_istio(family))
        else:
            plain.append(_without_created(family))
    if plain:
        parts.append(generate_latest(_Families(plain)))
    return b"".join(parts)
