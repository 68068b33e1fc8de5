"""The dashboard's data behind `/ui/api/*`: where the graph's samples come from (the agent
scraper or a Prometheus), the graph of a window (built in a worker thread, once per pair of
snapshots, shared by every viewer), the proxies across replicas and the config. routes.py
is the HTTP adapter over it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from control.config.errors import ConfigError
from control.ctl.status import ProxyRow
from control.model.types import MeshConfig
from control.ui.configview import config_json
from control.ui.details import DetailIndex, edge_detail, node_detail
from control.ui.graph import Graph, build_graph, only_namespaces
from control.ui.promapi import PrometheusError
from control.ui.proxies import local_streams, merge_rows, proxies_json
from control.ui.samples import Snapshot
from pilotfish_common.lifecycle import Lifecycle

logger = logging.getLogger(__name__)


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


class Dashboard(Lifecycle):
    def __init__(
        self,
        source: MetricsSource,
        *,
        syncz: Callable[[], list[dict[str, Any]]],
        config: ConfigView,
        index: Callable[[], DetailIndex],
        remote_rows: RemoteRows | None = None,
    ) -> None:
        self.source = source
        self._syncz = syncz
        self._config = config
        self._index = index
        self._remote_rows = remote_rows
        # (window, start snapshot, end snapshot) -> the answer being built or built.
        self._graphs: dict[tuple[float, int, int], asyncio.Future[GraphAnswer]] = {}

    async def start(self) -> None:
        await self.source.start()

    async def close(self) -> None:
        await self.source.close()

    async def graph(self, window: float) -> GraphAnswer:
        try:
            pair = await self.source.window(window)
        except PrometheusError as e:
            raise SourceError(str(e)) from None
        if pair is None:
            return GraphAnswer(None, _graph_body(None, window, self.source.name), window)
        start, end = pair
        key = (window, id(start), id(end))
        pending = self._graphs.get(key)
        if pending is None:
            # Only the latest pair is worth keeping; older answers go with their snapshots.
            for old in [k for k in self._graphs if k[0] == window]:
                del self._graphs[old]
            pending = asyncio.get_running_loop().create_future()
            self._graphs[key] = pending
            try:
                answer = await asyncio.to_thread(_answer, start, end, window, self.source.name)
            except BaseException as e:
                self._graphs.pop(key, None)
                pending.set_exception(e)
                pending.exception()  # retrieved: other waiters get it raised
                raise
            pending.set_result(answer)
        return await asyncio.shield(pending)

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
        return config_json(self._config.current, self._config.errors, namespaces, kinds)

    async def node(self, node_id: str, window: float) -> dict[str, object]:
        answer = await self.graph(window)
        return node_detail(node_id, answer.graph, self._config.current, self._index())

    async def edge(self, edge_id: str, window: float) -> dict[str, object]:
        answer = await self.graph(window)
        return edge_detail(edge_id, answer.graph, self._config.current, self._index())


def _answer(start: Snapshot, end: Snapshot, window: float, source: str) -> GraphAnswer:
    graph = build_graph(start, end)
    return GraphAnswer(graph, _graph_body(graph, window, source), window)


def _graph_body(graph: Graph | None, window: float, source: str) -> bytes:
    data: dict[str, object]
    if graph is None:
        data = {"interval": 0, "namespaces": [], "nodes": [], "edges": [], "errors": {}}
    else:
        data = graph.as_json()
    data = {"source": source, "window": window, "collecting": graph is None, **data}
    return json.dumps(data, separators=(",", ":")).encode()
