"""A quantile from histogram bucket counts, as Prometheus's histogram_quantile computes it
(sans-IO): linear interpolation inside the bucket the rank falls in, the lowest bucket
starting at 0, and the highest finite bound when the rank falls in `+Inf`."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """`buckets`: cumulative count (or rate) per upper bound `le`, `+Inf` included. None when
    nothing was observed or there is no `+Inf` bucket."""
    bounds = sorted(buckets)
    return histogram_quantiles((q,), bounds, [buckets[b] for b in bounds])[0]


def histogram_quantiles(
    qs: Sequence[float], bounds: Sequence[float], counts: Sequence[float]
) -> list[float | None]:
    """histogram_quantile for each of `qs` over buckets as vectors: `bounds` ascending, the
    cumulative count of each."""
    if not bounds or not math.isinf(bounds[-1]):
        return [None] * len(qs)
    # Counts are cumulative; a scrape can catch buckets mid-update, so keep them monotonic.
    cumulative: list[float] = []
    top = 0.0
    for c in counts:
        top = c if c > top else top
        cumulative.append(top)
    if top <= 0:
        return [None] * len(qs)
    return [_rank(q, bounds, cumulative, top) if 0.0 <= q <= 1.0 else None for q in qs]


def _rank(q: float, bounds: Sequence[float], counts: Sequence[float], total: float) -> float | None:
    rank = q * total
    i = bisect_left(counts, rank)
    bound = bounds[i]
    if math.isinf(bound):
        # Past every finite bound: the best that can be said is the highest one.
        return bounds[i - 1] if i > 0 else None
    if i == 0 and bound <= 0:
        return bound
    lower = bounds[i - 1] if i > 0 else 0.0
    below = counts[i - 1] if i > 0 else 0.0
    in_bucket = counts[i] - below
    if in_bucket <= 0:
        return bound
    return lower + (bound - lower) * (rank - below) / in_bucket
