"""What the two `security.istio.io` kinds share: API versions and the `selector` field."""

from __future__ import annotations

from control.config.fields import Fields
from control.model.types import Labels, labels_of

SECURITY_VERSIONS = ("security.istio.io/v1", "security.istio.io/v1beta1")


def match_labels(spec: Fields) -> Labels | None:
    """`selector: {matchLabels: {...}}`; None when absent (the policy is namespace-wide).

    An empty `matchLabels` is rejected rather than read as "whole namespace": a user who wrote
    a selector meant to narrow the policy, and widening it silently is the wrong failure."""
    selector = spec.get_map("selector")
    if selector is None:
        return None
    labels = selector.get_labels("matchLabels")
    selector.finish()
    if not labels:
        spec.ctx.fail(
            (*spec.at("selector"), "matchLabels"),
            "must have at least one label (omit selector to apply to the whole namespace)",
        )
    return labels_of(labels)
