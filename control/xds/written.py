"""What the ADS server counts about the responses it writes: pushes and push time per type,
send time, and the size of each distinct response once. On the hot path of a push, so the
metric children are looked up once per type (prometheus `labels()` is slow) instead of once
per write.
"""

from __future__ import annotations

from typing import Any

from control.metrics import Metrics, metric_type


class WrittenResponses:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._send_time = metrics.send_time
        # type_url -> (pushes counter, push time, size histogram, [last response observed])
        self._by_type: dict[str, tuple[Any, Any, Any, list[bytes | None]]] = {}

    def written(self, type_url: str, data: bytes, push_time: float, send_time: float) -> None:
        """`push_time`: seconds from the start of generating the response to its write done;
        `send_time`: of the write alone."""
        found = self._by_type.get(type_url)
        if found is None:
            label = metric_type(type_url)
            found = (
                self._metrics.pushes.labels(label),
                self._metrics.push_time.labels(label),
                self._metrics.config_size.labels(label),
                [None],
            )
            self._by_type[type_url] = found
        pushes, push_times, sizes, last = found
        pushes.inc()
        push_times.observe(push_time)
        self._send_time.observe(send_time)
        if data is not last[0]:
            # Streams share the bytes of identical responses: the size is observed once per
            # distinct response, not once per stream.
            last[0] = data
            sizes.observe(len(data))
