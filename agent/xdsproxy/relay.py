"""Relay one downstream ADS stream (Envoy's, or a proxyless client's) over its own upstream
stream on the shared channel.

Directions are asymmetric on purpose (istio#39209 deadlocked here): requests go into an
unbounded queue, so reading the downstream never waits for the upstream; responses are
written downstream before the next one is read from upstream, so a slow consumer slows its
own upstream stream through gRPC flow control instead of growing a buffer.

Responses are routed by type URL, read from the raw bytes without decoding the resources:
a type with a consuming handler goes to the handler and is ACKed or NACKed by the agent;
anything else is forwarded as the exact bytes the control plane sent, and then, for an
observed type, queued (the same bytes, no copy) for its observer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol

import grpc
from envoy.service.discovery.v3.discovery_pb2 import (
    DeltaDiscoveryRequest,
    DeltaDiscoveryResponse,
    DiscoveryRequest,
    DiscoveryResponse,
)

from agent.xdsproxy.errors import classify
from agent.xdsproxy.handlers import HandlerError, HandlerRegistry
from agent.xdsproxy.handlers import serialize as _serialize
from agent.xdsproxy.upstream import UpstreamChannel
from protos import wire

logger = logging.getLogger(__name__)

_TYPE_URL = 4
_NONCE = 5
_VERSION = 1
_SCAN = frozenset((_VERSION, _TYPE_URL, _NONCE))
_TYPE_ONLY = frozenset((_TYPE_URL,))


class RelayObserver(Protocol):
    """Where relay events go besides the plain counters (the agent's Prometheus metrics)."""

    def request(self, type_url: str) -> None: ...
    def response(self, type_url: str) -> None: ...
    def upstream_error(self, kind: str) -> None: ...
    def nack(self, type_url: str) -> None: ...
    def streams(self, delta: int) -> None: ...


@dataclass(eq=False)
class RelayStats:
    """Counters the relay updates, forwarded to an optional observer (metrics)."""

    requests: int = 0
    responses: int = 0
    handled: int = 0
    nacks: int = 0
    errors: dict[str, int] = field(default_factory=lambda: {"expected": 0, "unexpected": 0})
    observer: RelayObserver | None = None
    # Called once, at the first response from the control plane on any stream (the agent's
    # start timeline).
    on_first_response: Callable[[], None] | None = None

    def response_seen(self) -> None:
        if self.on_first_response is not None:
            hook, self.on_first_response = self.on_first_response, None
            hook()

    def on_request(self, type_url: str) -> None:
        self.requests += 1
        if self.observer is not None:
            self.observer.request(type_url)

    def on_response(self, type_url: str) -> None:
        self.responses += 1
        self.response_seen()
        if self.observer is not None:
            self.observer.response(type_url)

    def on_error(self, kind: str) -> None:
        self.errors[kind] += 1
        if self.observer is not None:
            self.observer.upstream_error(kind)

    def on_nack(self, type_url: str) -> None:
        self.nacks += 1
        if self.observer is not None:
            self.observer.nack(type_url)

    def on_stream(self, delta: int) -> None:
        if self.observer is not None:
            self.observer.streams(delta)


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
        # The newest version ACKed per such type (by the agent or the downstream): a NACK
        # restates it, as Envoy's do.
        self._acked_versions: dict[str, str] = {}

    async def run(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        call = self._upstream.ads(delta=self._delta)
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        reader = asyncio.create_task(self._read_downstream(requests, queue))
        writer = asyncio.create_task(self._write_upstream(call, queue))
        try:
            await self._pump_responses(call, context, queue)
        except UpstreamEnded as e:
            kind = classify(e.code, e.details)
            self._stats.on_error(kind)
            log = logger.info if kind == "expected" else logger.warning
            log("relay %s: upstream ended (%s: %s)", self.name, e.code, e.details)
            # Envoy keeps its config and re-dials; the new stream waits for the channel. A
            # request the control plane could not take (malformed, no node) is the
            # downstream's own error, and says so: re-sending it would only fail again.
            code = (
                grpc.StatusCode.INVALID_ARGUMENT
                if e.code is grpc.StatusCode.INVALID_ARGUMENT
                else grpc.StatusCode.UNAVAILABLE
            )
            await context.abort(code, f"upstream: {e.details}")
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
                self._stats.on_request(self._note_request(raw))
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
                try:
                    fields = wire.scan_strings(raw, _SCAN)
                except ValueError as e:
                    raise UpstreamEnded(grpc.StatusCode.INTERNAL, f"bad response: {e}") from e
                type_url = fields.get(_TYPE_URL, "")
                self._stats.on_response(type_url)
                if self._handlers.consumes(type_url):
                    queue.put_nowait(await self._handle(type_url, raw))
                    continue
                rewriter = self._handlers.rewriters.get(type_url)
                if rewriter is not None:
                    try:
                        raw = await rewriter.rewrite(raw, delta=self._delta) or raw
                    except HandlerError as e:
                        logger.warning("relay %s: %s not forwarded: %s", self.name, type_url, e)
                        queue.put_nowait(self._nack(type_url, raw, e))
                        continue
                await context.write(raw)
                if self._handlers.observes(type_url):
                    self._handlers.observe(type_url, raw, delta=self._delta)
        except grpc.aio.AioRpcError as e:
            raise UpstreamEnded(e.code(), e.details() or "") from e
        # The control plane closed the stream cleanly: the downstream must re-dial too.
        raise UpstreamEnded(grpc.StatusCode.UNAVAILABLE, "upstream closed the stream")

    async def _handle(self, type_url: str, raw: bytes) -> bytes:
        """Run the handler; the ACK or NACK to send upstream."""
        self._stats.handled += 1
        try:
            if self._delta:
                resources = [r.resource for r in DeltaDiscoveryResponse.FromString(raw).resources]
            else:
                resources = list(DiscoveryResponse.FromString(raw).resources)
            await self._handlers.dispatch(type_url, resources)
        except HandlerError as e:
            logger.warning("relay %s: handler rejected %s: %s", self.name, type_url, e)
            return self._nack(type_url, raw, e)
        return self._answer(type_url, raw, None)

    def _nack(self, type_url: str, raw: bytes, error: HandlerError) -> bytes:
        self._stats.on_nack(type_url)
        return self._answer(type_url, raw, str(error))

    def _answer(self, type_url: str, raw: bytes, error: str | None) -> bytes:
        """The agent's ACK (error None) or NACK of a response, on the downstream's behalf."""
        if self._delta:
            dresp = DeltaDiscoveryResponse.FromString(raw)
            dreq = DeltaDiscoveryRequest(type_url=type_url, response_nonce=dresp.nonce)
            if error is not None:
                dreq.error_detail.code = grpc.StatusCode.INVALID_ARGUMENT.value[0]
                dreq.error_detail.message = error
            return _serialize(dreq)
        resp = DiscoveryResponse.FromString(raw)
        # A SotW request restates the subscription: the downstream's names, as it sent them.
        req = DiscoveryRequest(
            type_url=type_url,
            version_info=resp.version_info,
            response_nonce=resp.nonce,
            resource_names=self._handler_names.get(type_url, []),
        )
        if error is not None:
            req.version_info = self._acked_versions.get(type_url, "")
            req.error_detail.code = grpc.StatusCode.INVALID_ARGUMENT.value[0]
            req.error_detail.message = error
        else:
            self._acked_versions[type_url] = resp.version_info
        return _serialize(req)

    def _note_request(self, raw: bytes) -> str:
        """The request's type URL; for handler types, also the subscribed names (to ACK on
        the downstream's behalf). Malformed requests are the control plane's to reject."""
        try:
            type_url = wire.scan_strings(raw, _TYPE_ONLY).get(_TYPE_URL, "")
        except ValueError:
            return ""
        if not self._delta and (
            self._handlers.consumes(type_url) or type_url in self._handlers.rewriters
        ):
            req = DiscoveryRequest.FromString(raw)
            self._handler_names[type_url] = list(req.resource_names)
            if req.version_info and not req.HasField("error_detail"):
                self._acked_versions[type_url] = req.version_info
        return type_url
