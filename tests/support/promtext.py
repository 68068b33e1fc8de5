"""Read Prometheus text exposition by the exact sample names it shows.

prometheus_client's parser renames counter samples to `<name>_total`, which would hide the
very thing the control plane's tests check (Istio's names, without the suffix), so this reads
the lines as they are. It also checks each line has the exposition's shape.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')


@dataclass(frozen=True)
class Exposition:
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]
    types: dict[str, str]

    def value(self, name: str, **labels: str) -> float | None:
        """The one sample of `name` with exactly these labels, or None."""
        return self.samples.get((name, frozenset(labels.items())))

    def total(self, name: str, **labels: str) -> float:
        """The sum over samples of `name` whose labels include these (0 when none)."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= ls)

    def series(self, name: str) -> list[dict[str, str]]:
        return [dict(ls) for (n, ls) in self.samples if n == name]

    def names(self) -> set[str]:
        return {n for n, _ in self.samples}


def parse(text: str) -> Exposition:
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
            continue
        if line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, raw_labels, value = m.groups()
        labels = frozenset(_LABEL.findall(raw_labels or ""))
        samples[(name, labels)] = float(value)
    return Exposition(samples, types)
