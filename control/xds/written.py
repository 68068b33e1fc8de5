"""What the ADS server counts about the responses it writes: pushes per type, and the size of
each distinct response once. On the hot path of a push, so the metric children are looked up
once per type (prometheus `labels()` is slow) instead of once per write.
"""

from __future__ import annotations

from typing import Any

from control.metrics import Metrics
from protos import typeurls


class WrittenResponses:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        # type_url -> (pushes counter, size histogram, [last response observed])
        self._by_type: dict[str, tuple[Any, Any, list[bytes | None]]] = {}

    def written(self, type_url: str, data: bytes) -> None:
        found = self._by_type.get(type_url)
        if found is None:
            short = typeurls.SHORT_NAMES.get(type_url, type_url)
            found = (
                self._metrics.pushes.labels(short),
                self._metrics.config_size.labels(short),
                [None],
            )
            self._by_type[type_url] = found
        pushes, sizes, last = found
        pushes.inc()
        if data is not last[0]:
            # Streams share the bytes of identical responses: the size is observed once per
            # distinct response, not once per stream.
            last[0] = data
            sizes.observe(len(data))
