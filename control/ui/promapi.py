"""The graph's samples from a Prometheus (`--prometheus-url`), over its HTTP API.

The same two-instant question the scraper answers from its history, asked of Prometheus: the
Istio series' values at `now - window` and at `now` (`/api/v1/query` with `time`), one
target per `instance` label. `snapshot_from_vector` (sans-IO) turns an answer into a
Snapshot; `PrometheusSource` is the thin client.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from control.ui.samples import GRAPH_METRICS, Sample, Snapshot, TargetSamples
from pilotfish_common.lifecycle import Lifecycle

QUERY = '{__name__=~"' + "|".join(sorted(GRAPH_METRICS)) + '"}'


class PrometheusError(Exception):
    """Prometheus could not be asked or answered with an error (one line)."""


def snapshot_from_vector(answer: Mapping[str, Any], at: float) -> Snapshot:
    """A Snapshot from a `/api/v1/query` answer (resultType vector); PrometheusError when it is
    not one."""
    if answer.get("status") != "success":
        raise PrometheusError(str(answer.get("error") or "query failed"))
    data = answer.get("data") or {}
    if data.get("resultType") != "vector":
        raise PrometheusError(f"expected a vector, got {data.get('resultType')!r}")
    by_target: dict[str, list[Sample]] = {}
    for item in data.get("result") or []:
        metric = dict(item.get("metric") or {})
        name = str(metric.pop("__name__", ""))
        try:
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if name not in GRAPH_METRICS or not math.isfinite(value):
            continue
        target = str(metric.get("instance", ""))
        labels = tuple(sorted((str(k), str(v)) for k, v in metric.items()))
        by_target.setdefault(target, []).append(Sample(name, labels, value))
    return Snapshot(at, {t: TargetSamples.of(at, s) for t, s in by_target.items()})


class PrometheusSource(Lifecycle):
    name = "prometheus"

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url.rstrip("/")
        self._timeout = timeout
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout))

    async def close(self) -> None:
        if self._session is not None:
            with contextlib.suppress(Exception):
                await self._session.close()
            self._session = None

    def wanted(self) -> None:
        """Nothing to keep running: Prometheus keeps the history."""

    async def window(self, seconds: float) -> tuple[Snapshot, Snapshot] | None:
        now = self._clock()
        start, end = await asyncio.gather(self._query(now - seconds), self._query(now))
        return start, end

    async def _query(self, at: float) -> Snapshot:
        assert self._session is not None
        try:
            async with self._session.get(
                f"{self.url}/api/v1/query", params={"query": QUERY, "time": f"{at:.3f}"}
            ) as response:
                answer = await response.json(content_type=None)
        except TimeoutError:
            raise PrometheusError(f"{self.url}: no answer within {self._timeout:g}s") from None
        except (aiohttp.ClientError, OSError, ValueError) as e:
            raise PrometheusError(f"{self.url}: {e or type(e).__name__}") from None
        if not isinstance(answer, dict):
            raise PrometheusError(f"{self.url}: not a Prometheus API answer")
        return snapshot_from_vector(answer, at)
