"""The dashboard's data behind `/ui/api/*`: where the graph's samples come from (the agent
scraper or a Prometheus), the graph of a window (built in a worker thread, once per pair of
snapshots, shared by every viewer), the proxies across replicas and the config. routes.py
is the HTTP adapter over it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from control.config.errors import ConfigError
from control.ctl.status import ProxyRow
from control.model.types import MeshConfig
from control.ui.configview import config_json
from control.ui.details import DetailIndex, edge_detail, node_detail
from control.ui.graph import FlowCache, Graph, build_graph, only_namespaces
from control.ui.promapi import PrometheusError
from control.ui.proxies import local_streams, merge_rows, proxies_json
from control.ui.samples import Snapshot
from pilotfish_common.lifecycle import Lifecycle

logger = logging.getLogger(__name__)

MAX_WINDOWS = 8


class MetricsSource(Protocol):
    """AgentScraper or PrometheusSource: the snapshots that bound the last `seconds`."""

    name: str

    async def start(self) -> object: ...

    async def close(self) -> object: ...

    async def window(self, seconds: float) -> tuple[Snapshot, Snapshot] | None: ...


class ConfigView(Protocol):
    @property
    def current(self) -> MeshConfig: ...

    @property
    def errors(self) -> Mapping[str, ConfigError]: ...


# Other replicas' rows and the replicas that could not be asked (one line each).
RemoteRows = Callable[[], Awaitable[tuple[list[ProxyRow], list[str]]]]


class SourceError(Exception):
    """The metrics could not be read (a Prometheus that does not answer): 502."""


@dataclass(frozen=True, slots=True)
class GraphAnswer:
    graph: Graph | None  # None: not two snapshots yet
    body: bytes  # the whole graph as JSON (what most requests get)
    window: float
    # The snapshots it was built from (held, so that they identify it).
    start: Snapshot | None = None
    end: Snapshot | None = None

    def built_from(self, start: Snapshot, end: Snapshot) -> bool:
        return self.start is start and self.end is end


class Dashboard(Lifecycle):
    def __init__(
        self,
        source: MetricsSource,
        *,
        syncz: Callable[[], list[dict[str, Any]]],
        config: ConfigView,
        index: Callable[[], DetailIndex],
        remote_rows: RemoteRows | None = None,
        statuses: Callable[[MeshConfig], Iterable[Mapping[str, Any]]] = lambda config: (),
    ) -> None:
        self.source = source
        # Status the control plane computes for objects (Gateway API), as configz shows it.
        self._statuses = statuses
        self._syncz = syncz
        self._config = config
        self._index = index
        self._remote_rows = remote_rows
        # Per window: the last graph built, and the one being built from newer snapshots.
        self._latest: dict[float, GraphAnswer] = {}
        self._building: dict[float, tuple[Snapshot, Snapshot, asyncio.Task[GraphAnswer]]] = {}
        self._build_times: dict[float, tuple[float, float]] = {}  # window -> (start, seconds)
        self._flows = FlowCache()

    async def start(self) -> None:
        await self.source.start()

    async def close(self) -> None:
        for _, _, task in self._building.values():
            task.cancel()
        self._building.clear()
        await self.source.close()

    async def graph(self, window: float) -> GraphAnswer:
        """The graph of the last `window` seconds. Building a large mesh's graph takes longer
        than serving it, so while the graph of newer snapshots is built (in a worker thread,
        once for every viewer) the previous one is served: at most one scrape old."""
        try:
            pair = await self.source.window(window)
        except PrometheusError as e:
            raise SourceError(str(e)) from None
        if pair is None:
            return GraphAnswer(None, _graph_body(None, window, self.source.name), window)
        start, end = pair
        latest = self._latest.get(window)
        if latest is not None and latest.built_from(start, end):
            return latest
        building = self._building.get(window)
        if building is not None and building[0] is start and building[1] is end:
            pass
        elif latest is not None and self._too_soon(window):
            return latest
        else:
            task = asyncio.create_task(self._build(start, end, window))
            building = self._building[window] = (start, end, task)
        if latest is not None:
            return latest
        return await asyncio.shield(building[2])

    def _too_soon(self, window: float) -> bool:
        """Whether the last build of `window` started less than twice its duration ago: a
        large mesh's graph is then rebuilt as often as half of one core allows, not on
        every scrape, so serving it stays fast."""
        last = self._build_times.get(window)
        return last is not None and time.monotonic() - last[0] < 2 * last[1]

    async def _build(self, start: Snapshot, end: Snapshot, window: float) -> GraphAnswer:
        began = time.monotonic()
        try:
            answer = await asyncio.to_thread(
                _answer, start, end, window, self.source.name, self._flows
            )
            self._build_times[window] = (began, time.monotonic() - began)
        finally:
            current = self._building.get(window)
            if current is not None and current[2] is asyncio.current_task():
                del self._building[window]
        previous = self._latest.get(window)
        # A slower build of older snapshots never replaces a newer graph.
        if previous is None or previous.end is None or previous.end.at <= end.at:
            self._latest.pop(window, None)
            self._latest[window] = answer
            # Any window may be asked for; only the few most recent ones keep a graph.
            while len(self._latest) > MAX_WINDOWS:
                oldest = next(iter(self._latest))
                del self._latest[oldest]
                self._build_times.pop(oldest, None)
        return answer

    async def graph_body(self, window: float, namespaces: frozenset[str] | None) -> bytes:
        answer = await self.graph(window)
        if not namespaces or answer.graph is None:
            return answer.body
        return _graph_body(only_namespaces(answer.graph, namespaces), window, self.source.name)

    async def proxies(self, namespaces: frozenset[str] | None) -> dict[str, object]:
        remote: list[ProxyRow] = []
        failed: list[str] = []
        if self._remote_rows is not None:
            remote, failed = await self._remote_rows()
        rows = merge_rows(local_streams(self._syncz()), remote)
        return proxies_json(rows, namespaces, failed)

    def config(
        self, namespaces: frozenset[str] | None, kinds: frozenset[str] | None
    ) -> dict[str, object]:
        config = self._config.current
        return config_json(config, self._config.errors, namespaces, kinds, self._statuses(config))

    async def node(self, node_id: str, window: float) -> dict[str, object]:
        answer = await self.graph(window)
        return node_detail(node_id, answer.graph, self._config.current, self._index())

    async def edge(self, edge_id: str, window: float) -> dict[str, object]:
        answer = await self.graph(window)
        return edge_detail(edge_id, answer.graph, self._config.current, self._index())


def _answer(
    start: Snapshot, end: Snapshot, window: float, source: str, flows: FlowCache | None = None
) -> GraphAnswer:
    graph = build_graph(start, end, flows=flows)
    return GraphAnswer(graph, _graph_body(graph, window, source), window, start, end)


def _graph_body(graph: Graph | None, window: float, source: str) -> bytes:
    data: dict[str, object]
    if graph is None:
        data = {"interval": 0, "namespaces": [], "nodes": [], "edges": [], "errors": {}}
    else:
        data = graph.as_json()
    data = {"source": source, "window": window, "collecting": graph is None, **data}
    return json.dumps(data, separators=(",", ":")).encode()
