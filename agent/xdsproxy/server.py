"""The downstream xDS server on `<workdir>/XDS`: Envoy and proxyless gRPC clients connect
here; each stream is relayed upstream (see relay.py)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from agent.unixsocket import UnixGrpcServer, UnixService, xds_socket_server
from agent.xdsproxy.handlers import HandlerRegistry
from agent.xdsproxy.relay import Relay, RelayStats
from agent.xdsproxy.upstream import UpstreamChannel
from protos.ads import raw_ads_handler

logger = logging.getLogger(__name__)


class DownstreamServer(UnixService):
    label = "xDS proxy"

    def __init__(
        self,
        socket_path: Path,
        upstream: UpstreamChannel,
        handlers: HandlerRegistry,
        stats: RelayStats,
        server: UnixGrpcServer | None = None,
    ) -> None:
        """`server`: the socket, when it was bound beforehand (agent/launch.py)."""
        super().__init__(socket_path, server or xds_socket_server(socket_path))
        self._upstream = upstream
        self._handlers = handlers
        self._stats = stats
        self._ids = itertools.count(1)
        self.active = 0

    def _handler(self) -> grpc.GenericRpcHandler:
        return raw_ads_handler(self._sotw, self._delta)

    async def _sotw(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> None:
        await self._relay(requests, context, delta=False)

    async def _delta(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> None:
        await self._relay(requests, context, delta=True)

    async def _relay(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext, *, delta: bool
    ) -> None:
        name = f"{'delta' if delta else 'sotw'}-{next(self._ids)}"
        self.active += 1
        self._stats.on_stream(1)
        logger.debug("downstream stream %s opened", name)
        try:
            await Relay(self._upstream, self._handlers, self._stats, delta=delta, name=name).run(
                requests, context
            )
        finally:
            self.active -= 1
            self._stats.on_stream(-1)
            logger.debug("downstream stream %s closed", name)
