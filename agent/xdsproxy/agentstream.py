"""The agent's own ADS stream: subscriptions the agent consumes itself (NameTable,
ProxyConfig, ...), on the shared upstream channel, answered by ResponseHandlers.

It reconnects with jittered exponential backoff when the stream ends and re-subscribes to
every handler type; a response is ACKed after its handler returns and NACKed with the
handler's error when it raises.

It also carries the workload's health reports (`report_health`, Istio's `istio.io/health`
DiscoveryRequest: no error_detail when healthy, the reason in error_detail when not). The
newest report is sent again after every reconnect, so a restarted control plane learns the
current health without waiting for the next change. All writes go through one writer task
per call (a gRPC stream takes one write at a time).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest, DiscoveryResponse
from google.protobuf import struct_pb2

from agent.xdsproxy.errors import classify
from agent.xdsproxy.handlers import HandlerError, HandlerRegistry
from agent.xdsproxy.handlers import serialize as _serialize
from agent.xdsproxy.relay import RelayStats
from agent.xdsproxy.upstream import UpstreamChannel
from pilotfish_common.backoff import Backoff
from pilotfish_common.lifecycle import Lifecycle
from pilotfish_common.tasks import cancel
from protos.typeurls import HEALTH

logger = logging.getLogger(__name__)


class AgentStream(Lifecycle):
    def __init__(
        self,
        upstream: UpstreamChannel,
        handlers: HandlerRegistry,
        stats: RelayStats,
        *,
        node_id: str,
        metadata: Mapping[str, object],
        backoff: Backoff | None = None,
    ) -> None:
        self._upstream = upstream
        self._handlers = handlers
        self._stats = stats
        self._node_id = node_id
        self._metadata = metadata
        self._backoff = backoff or Backoff()
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()
        self.received: dict[str, int] = {}  # responses handled per type (for readiness)
        self._health: bytes | None = None  # the newest health report, re-sent on reconnect
        self._outbox: asyncio.Queue[bytes] | None = None  # the current call's writes

    def report_health(self, error: str | None) -> None:
        """Tell the control plane the workload's health (`error` None: healthy)."""
        req = DiscoveryRequest(type_url=HEALTH)
        if error is not None:
            req.error_detail.code = grpc.StatusCode.UNAVAILABLE.value[0]
            req.error_detail.message = error
        self._health = _serialize(req)
        if self._outbox is not None:
            self._outbox.put_nowait(self._health)

    async def start(self) -> None:
        if self._handlers.type_urls:
            self._task = asyncio.create_task(self._run(), name="agent-stream")

    async def close(self) -> None:
        await cancel(self._task)
        self._task = None

    def _initial_requests(self) -> list[bytes]:
        out = []
        for i, type_url in enumerate(self._handlers.type_urls):
            req = DiscoveryRequest(type_url=type_url)
            if i == 0:
                req.node.id = self._node_id
                meta = struct_pb2.Struct()
                meta.update(dict(self._metadata))
                req.node.metadata.CopyFrom(meta)
            out.append(req.SerializeToString())
        return out

    async def _run(self) -> None:
        while True:
            call = self._upstream.ads(delta=False)
            outbox: asyncio.Queue[bytes] = asyncio.Queue()
            for raw in self._initial_requests():
                outbox.put_nowait(raw)
            if self._health is not None:
                outbox.put_nowait(self._health)
            self._outbox = outbox
            writer = asyncio.create_task(self._write(call, outbox), name="agent-stream-write")
            try:
                async for raw in call:
                    self.connected.set()
                    self._backoff.reset()
                    outbox.put_nowait(await self._answer(raw))
                code, details = grpc.StatusCode.UNAVAILABLE, "stream closed by the control plane"
            except grpc.aio.AioRpcError as e:
                code, details = e.code(), e.details() or ""
            finally:
                self._outbox = None
                call.cancel()
                await cancel(writer)
            self.connected.clear()
            kind = classify(code, details)
            self._stats.on_error(kind)
            delay = self._backoff.next_delay()
            log = logger.info if kind == "expected" else logger.warning
            log("agent stream ended (%s: %s); retrying in %.1fs", code, details, delay)
            await asyncio.sleep(delay)

    async def _write(self, call: grpc.aio.StreamStreamCall, outbox: asyncio.Queue[bytes]) -> None:
        try:
            while True:
                raw = await outbox.get()
                await call.write(raw)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as e:
            # The call ended; the reading side sees it too and reconnects.
            logger.debug("agent stream write ended: %r", e)

    async def _answer(self, raw: bytes) -> bytes:
        self._stats.response_seen()
        resp = DiscoveryResponse.FromString(raw)
        req = DiscoveryRequest(
            type_url=resp.type_url, version_info=resp.version_info, response_nonce=resp.nonce
        )
        if not self._handlers.consumes(resp.type_url):
            return _serialize(req)  # nothing to do with it; keep the stream in sync
        self._stats.handled += 1
        try:
            await self._handlers.dispatch(resp.type_url, list(resp.resources))
            self.received[resp.type_url] = self.received.get(resp.type_url, 0) + 1
        except HandlerError as e:
            self._stats.on_nack(resp.type_url)
            logger.warning("handler rejected %s: %s", resp.type_url, e)
            req.version_info = ""
            req.error_detail.code = grpc.StatusCode.INVALID_ARGUMENT.value[0]
            req.error_detail.message = str(e)
        return _serialize(req)
