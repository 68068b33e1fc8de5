"""The agent's xDS relay (agent/xdsproxy/): the handler registry, the relay's counters and the
downstream server on <workdir>/XDS, made from the agent's config and served.

Its own module, apart from agent/app.py, because `agent/__main__.py` serves Envoy's xDS
stream before importing the rest of the agent (agent/launch.py, `Launch.start_relay`):
Envoy's first request then goes upstream while the agent still imports its certificate,
SDS, DNS and status parts, instead of after.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from agent.config import AgentConfig
from agent.handlermetrics import HandlerMetricsObserver
from agent.metrics import AgentMetrics, MetricsObserver
from agent.startup import StartupTimeline
from agent.unixsocket import UnixGrpcServer
from agent.xdsproxy.handlers import Fetch, HandlerRegistry
from agent.xdsproxy.relay import RelayStats
from agent.xdsproxy.server import DownstreamServer
from agent.xdsproxy.upstream import UpstreamChannel
from protos.typeurls import EXTENSION_CONFIG

if TYPE_CHECKING:
    from agent.xdsproxy.ecds import ExtensionConfigRewriter

logger = logging.getLogger(__name__)


class LocalRelay:
    """What relays xDS between local clients (Envoy, proxyless apps) and the upstream
    channel. `serve()` loads the handler plug-ins, then serves the socket."""

    def __init__(
        self,
        cfg: AgentConfig,
        upstream: UpstreamChannel,
        metrics: AgentMetrics,
        timeline: StartupTimeline,
        *,
        handlers: HandlerRegistry | None = None,
        server: UnixGrpcServer | None = None,
    ) -> None:
        """`server`: the XDS socket, when it was bound beforehand (agent/launch.py)."""
        self.timeline = timeline
        self.handlers = handlers or HandlerRegistry()
        self.handlers.observer = HandlerMetricsObserver(metrics)
        # ECDS: remote Wasm code becomes a file in the workdir before Envoy sees the config;
        # plug-ins add fetchers for other schemes (registry.register_fetcher).
        self.handlers.fetchers.setdefault("http", _fetch_http)
        self.handlers.rewriters.setdefault(
            EXTENSION_CONFIG, LazyEcdsRewriter(cfg.workdir / "wasm", self.handlers.fetchers)
        )
        self.stats = RelayStats(
            observer=MetricsObserver(metrics),
            on_first_response=lambda: timeline.mark("first xds response"),
        )
        self.downstream = DownstreamServer(
            cfg.xds_socket, upstream, self.handlers, self.stats, server
        )
        self._served = False

    async def serve(self) -> None:
        """Plug-ins first (what they register must see the first responses), then the
        socket (idempotent)."""
        if self._served:
            return
        self._served = True
        # Plug-ins import their modules (file I/O) and may look up message types.
        loaded = await asyncio.to_thread(self.handlers.load_entry_points)
        if loaded:
            logger.info("response handlers from plug-ins: %s", ", ".join(loaded))
        await self.downstream.start()
        self.timeline.mark("xds served")


class LazyEcdsRewriter:
    """ECDS's rewriter (agent/xdsproxy/ecds.py), made with the first ECDS response: remote Wasm
    is rare, and an agent that is never sent ECDS loads none of it (its start and its idle
    memory, issue 23)."""

    def __init__(self, cache_dir: Path, fetchers: dict[str, Fetch]) -> None:
        self.cache_dir = cache_dir
        self._fetchers = fetchers
        self.rewriter: ExtensionConfigRewriter | None = None

    async def rewrite(self, raw: bytes, *, delta: bool) -> bytes | None:
        if self.rewriter is None:
            await asyncio.to_thread(importlib.import_module, "agent.xdsproxy.ecds")
            from agent.xdsproxy.ecds import ExtensionConfigRewriter

            # Checked again after the wait: two streams' first responses make one rewriter
            # (its locks are what fetches each module once).
            if self.rewriter is None:
                self.rewriter = ExtensionConfigRewriter(self.cache_dir, self._fetchers)
        return await self.rewriter.rewrite(raw, delta=delta)


async def _fetch_http(uri: str) -> bytes:
    """ECDS's built-in http fetcher: called only by the rewriter, which imported its module."""
    from agent.xdsproxy.ecds import fetch_http

    return await fetch_http(uri)
