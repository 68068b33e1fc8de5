"""A quantile from histogram bucket counts, as Prometheus's histogram_quantile computes it
(sans-IO): linear interpolation inside the bucket the rank falls in, the lowest bucket
starting at 0, and the highest finite bound when the rank falls in `+Inf`."""

from __future__ import annotations

import math
from collections.abc import Mapping


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """`buckets`: cumulative count (or rate) per upper bound `le`, `+Inf` included. None when
    nothing was observed or there is no `+Inf` bucket."""
    if not 0.0 <= q <= 1.0 or math.inf not in buckets:
        return None
    bounds = sorted(buckets)
    # Counts are cumulative; a scrape can catch buckets mid-update, so keep them monotonic.
    counts: list[float] = []
    for b in bounds:
        counts.append(max(buckets[b], counts[-1] if counts else 0.0))
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    for i, (bound, count) in enumerate(zip(bounds, counts, strict=True)):
        if count >= rank:
            if math.isinf(bound):
                # Past every finite bound: the best that can be said is the highest one.
                return bounds[i - 1] if i > 0 else None
            lower = bounds[i - 1] if i > 0 else 0.0
            below = counts[i - 1] if i > 0 else 0.0
            if i == 0 and bound <= 0:
                return bound
            in_bucket = count - below
            if in_bucket <= 0:
                return bound
            return lower + (bound - lower) * (rank - below) / in_bucket
    return None
