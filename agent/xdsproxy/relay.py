"""Relay one downstream ADS stream (Envoy's, or a proxyless client's) over its own upstream
stream on the shared channel.

Directions are asymmetric on purpose (istio#39209 deadlocked here): requests go into an
unbounded queue, so reading the downstream never waits for the upstream; responses are
written downstream before the next one is read from upstream, so a slow consumer slows its
own upstream stream through gRPC flow control instead of growing a buffer.

Responses are routed by type URL, read from the raw bytes without decoding the resources:
a type with a registered handler goes to the handler and is ACKed or NACKed by the agent;
anything else is forwarded as the exact bytes the control plane sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
from envoy.service.discovery.v3.discovery_pb2 import (
    DeltaDiscoveryRequest,
    DeltaDiscoveryResponse,
    DiscoveryRequest,
    DiscoveryResponse,
)

from agent.xdsproxy.backoff import classify
from agent.xdsproxy.handlers import HandlerError, HandlerRegistry
from agent.xdsproxy.handlers import serialize as _serialize
from agent.xdsproxy.upstream import UpstreamChannel
from protos import wire

logger = logging.getLogger(__name__)

_TYPE_URL = 4
_NONCE = 5
_VERSION = 1
_SCAN = frozenset((_VERSION, _TYPE_URL, _NONCE))


@dataclass
class RelayStats:
    """Counters the relay updates; the agent exposes them as metrics."""

    requests: int = 0
    responses: int = 0
    handled: int = 0
    nacks: int = 0
    errors: dict[str, int] = field(default_factory=lambda: {"expected": 0, "unexpected": 0})


class UpstreamEnded(Exception):
    def __init__(self, code: grpc.StatusCode | None, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class Relay:
    """Relays one stream. Create one per downstream call and `await run(...)`."""

    def __init__(
        self,
        upstream: UpstreamChannel,
        handlers: HandlerRegistry,
        stats: RelayStats,
        *,
        delta: bool,
        name: str = "",
    ) -> None:
        self._upstream = upstream
        self._handlers = handlers
        self._stats = stats
        self._delta = delta
        self.name = name
        # Subscriptions the downstream made for handler types, to ACK them on its behalf.
        self._handler_names: dict[str, list[str]] = {}

    async def run(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        call = self._upstream.ads(delta=self._delta)
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        reader = asyncio.create_task(self._read_downstream(requests, queue))
        writer = asyncio.create_task(self._write_upstream(call, queue))
        try:
            await self._pump_responses(call, context, queue)
        except UpstreamEnded as e:
            kind = classify(e.code, e.details)
            self._stats.errors[kind] += 1
            log = logger.info if kind == "expected" else logger.warning
            log("relay %s: upstream ended (%s: %s)", self.name, e.code, e.details)
            # Envoy keeps its config and re-dials; the new stream waits for the channel.
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"upstream: {e.details}")
        finally:
            reader.cancel()
            writer.cancel()
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.gather(reader, writer)

    async def _read_downstream(
        self, requests: AsyncIterator[bytes], queue: asyncio.Queue[bytes | None]
    ) -> None:
        try:
            async for raw in requests:
                self._stats.requests += 1
                self._note_handler_subscription(raw)
                queue.put_nowait(raw)
        except Exception as e:  # the downstream went away mid-read
            logger.debug("relay %s: downstream read ended: %s", self.name, e)
        queue.put_nowait(None)

    async def _write_upstream(
        self, call: grpc.aio.StreamStreamCall, queue: asyncio.Queue[bytes | None]
    ) -> None:
        while (raw := await queue.get()) is not None:
            try:
                await call.write(raw)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as e:
                logger.debug("relay %s: upstream write failed: %s", self.name, e)
                return
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await call.done_writing()

    async def _pump_responses(
        self,
        call: grpc.aio.StreamStreamCall,
        context: grpc.aio.ServicerContext,
        queue: asyncio.Queue[bytes | None],
    ) -> None:
        try:
            async for raw in call:
                self._stats.responses += 1
                try:
                    fields = wire.scan_strings(raw, _SCAN)
                except ValueError as e:
                    raise UpstreamEnded(grpc.StatusCode.INTERNAL, f"bad response: {e}") from e
                type_url = fields.get(_TYPE_URL, "")
                if type_url in self._handlers:
                    queue.put_nowait(await self._handle(type_url, raw))
                    continue
                await context.write(raw)
        except grpc.aio.AioRpcError as e:
            raise UpstreamEnded(e.code(), e.details() or "") from e
        # The control plane closed the stream cleanly: the downstream must re-dial too.
        raise UpstreamEnded(grpc.StatusCode.UNAVAILABLE, "upstream closed the stream")

    async def _handle(self, type_url: str, raw: bytes) -> bytes:
        """Run the handler; the ACK or NACK to send upstream."""
        self._stats.handled += 1
        if self._delta:
            dresp = DeltaDiscoveryResponse.FromString(raw)
            dreq = DeltaDiscoveryRequest(type_url=type_url, response_nonce=dresp.nonce)
            try:
                await self._handlers.dispatch(type_url, [r.resource for r in dresp.resources])
            except HandlerError as e:
                self._stats.nacks += 1
                dreq.error_detail.code = grpc.StatusCode.INVALID_ARGUMENT.value[0]
                dreq.error_detail.message = str(e)
            return _serialize(dreq)
        resp = DiscoveryResponse.FromString(raw)
        req = DiscoveryRequest(
            type_url=type_url,
            version_info=resp.version_info,
            response_nonce=resp.nonce,
            resource_names=self._handler_names.get(type_url, []),
        )
        try:
            await self._handlers.dispatch(type_url, list(resp.resources))
        except HandlerError as e:
            self._stats.nacks += 1
            logger.warning("relay %s: handler rejected %s: %s", self.name, type_url, e)
            req.version_info = ""
            req.error_detail.code = grpc.StatusCode.INVALID_ARGUMENT.value[0]
            req.error_detail.message = str(e)
        return _serialize(req)

    def _note_handler_subscription(self, raw: bytes) -> None:
        if self._delta or not self._handlers.type_urls:
            return
        try:
            type_url = wire.scan_strings(raw, frozenset((_TYPE_URL,))).get(_TYPE_URL, "")
        except ValueError:
            return  # the control plane will reject it; not ours to judge
        if type_url in self._handlers:
            self._handler_names[type_url] = list(DiscoveryRequest.FromString(raw).resource_names)
