"""Prometheus text exposition → the samples the graph needs (sans-IO).

Parsing is prometheus_client's own text parser (the format has escapes, optional timestamps,
comments and histograms that a hand-rolled split gets wrong). Lines of other metrics are
dropped before parsing: an agent's page is mostly Envoy's stats, and parsing those only to
discard them would cost more than everything else the dashboard does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

from control.ui.samples import GRAPH_METRICS, Sample


class PromTextError(ValueError):
    """The exposition text could not be parsed (one line, for the page and the log)."""


def _wanted(line: str, prefixes: tuple[str, ...]) -> bool:
    if line.startswith("#"):
        # "# TYPE name type" / "# HELP name text": kept for the metrics we read.
        parts = line.split(None, 3)
        return len(parts) >= 3 and parts[1] in ("TYPE", "HELP") and parts[2].startswith(prefixes)
    return line.startswith(prefixes)


def parse_samples(text: str, names: Iterable[str] = GRAPH_METRICS) -> list[Sample]:
    """The samples of the metrics `names` in `text` (non-finite values dropped)."""
    wanted = frozenset(names)
    # Series lines start with the sample name, which may carry a suffix of the family's
    # (`_bucket`, `_total`); the prefixes are the family names the parser will report.
    prefixes = tuple(sorted({_family(n) for n in wanted}))
    kept = "\n".join(line for line in text.splitlines() if _wanted(line.lstrip(), prefixes))
    out: list[Sample] = []
    try:
        for family in text_string_to_metric_families(kept + "\n"):
            for s in family.samples:
                if s.name not in wanted or not math.isfinite(s.value):
                    continue
                out.append(Sample(s.name, tuple(sorted(s.labels.items())), float(s.value)))
    except (ValueError, IndexError, TypeError) as e:
        raise PromTextError(f"bad Prometheus text: {e}") from None
    return out


def _family(name: str) -> str:
    for suffix in ("_bucket", "_total", "_count", "_sum"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
