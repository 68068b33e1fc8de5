"""What the two `security.istio.io` kinds share: API versions and the `selector` field (which
Telemetry and DestinationRule use too)."""

from __future__ import annotations

from control.config.fields import Fields
from control.model.types import Labels, labels_of

SECURITY_VERSIONS = ("security.istio.io/v1", "security.istio.io/v1beta1")


def match_labels(spec: Fields, key: str = "selector") -> Labels | None:
    """`selector: {matchLabels: {...}}` (Istio's WorkloadSelector; a DestinationRule names it
    `workloadSelector`); None when absent (the object is namespace-wide).

    An empty `matchLabels` is rejected rather than read as "whole namespace": a user who wrote
    a selector meant to narrow the object, and widening it silently is the wrong failure."""
    selector = spec.get_map(key)
    if selector is None:
        return None
    labels = selector.get_labels("matchLabels")
    selector.finish()
    if not labels:
        spec.ctx.fail(
            (*spec.at(key), "matchLabels"),
            f"must have at least one label (omit {key} to apply to the whole namespace)",
        )
    return labels_of(labels)
