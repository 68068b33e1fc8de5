"""Where a workload or proxy runs, as Istio names it: `region/zone/subzone`, read from the
labels Istio reads when nothing states it directly."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

# Kubernetes' topology labels and Istio's subzone label.
REGION_LABEL: Final = "topology.kubernetes.io/region"
ZONE_LABEL: Final = "topology.kubernetes.io/zone"
SUBZONE_LABEL: Final = "topology.istio.io/subzone"
TOPOLOGY_LABELS: Final = (REGION_LABEL, ZONE_LABEL, SUBZONE_LABEL)
# Istio's per-pod override, `region.zone.subzone` (a label value cannot hold a '/').
LOCALITY_LABEL: Final = "istio-locality"


def locality_from_labels(labels: Mapping[str, str]) -> str:
    """The locality the labels state: Istio's `istio-locality` label first, else the
    topology labels; "" when none is set."""
    override = labels.get(LOCALITY_LABEL, "")
    if override:
        return "/".join(override.split(".")[:3])
    return join_locality(*(labels.get(key, "") for key in TOPOLOGY_LABELS))


def join_locality(region: str, zone: str = "", subzone: str = "") -> str:
    """`region/zone/subzone` without trailing empty parts."""
    parts = [region, zone, subzone]
    while parts and not parts[-1]:
        parts.pop()
    return "/".join(parts)


def split_locality(value: str) -> tuple[str, str, str]:
    region, _, rest = value.partition("/")
    zone, _, subzone = rest.partition("/")
    return region, zone, subzone


def with_topology_labels(labels: Mapping[str, str], locality: str) -> dict[str, str]:
    """The labels with the topology labels of `locality` added where they are missing (Istio
    matches `failoverPriority` topology keys against the locality itself)."""
    out = dict(labels)
    for key, part in zip(TOPOLOGY_LABELS, split_locality(locality), strict=True):
        if part:
            out.setdefault(key, part)
    return out
