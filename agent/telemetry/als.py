"""Envoy's gRPC access log service (`envoy.service.accesslog.v3.AccessLogService`) on
`<workdir>/ALS`: the generated loggers stream every request and TCP connection here, and each
entry goes into the `MetricsAggregator` (HTTP entries read as far as the metrics need, with
their label sets cached: agent/telemetry/wire.py).

The socket is 0600 (owned by Envoy's user when it runs as another): what arrives on it becomes
metrics, so only Envoy may connect. A message that does not decode ends its stream with
INVALID_ARGUMENT (Envoy reconnects); nothing else is lost.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from envoy.data.accesslog.v3.accesslog_pb2 import TCPAccessLogEntry
from envoy.service.accesslog.v3.als_pb2 import StreamAccessLogsResponse
from google.protobuf.message import DecodeError

from agent.telemetry.aggregator import MetricsAggregator
from agent.telemetry.wire import HttpDecoder, stream_entries
from agent.unixsocket import UnixGrpcServer, UnixService, als_socket_server
from protos.rawcalls import bytes_in

logger = logging.getLogger(__name__)

SERVICE = "envoy.service.accesslog.v3.AccessLogService"


class AccessLogServer(UnixService):
    label = "access log service"

    def __init__(
        self,
        socket_path: Path,
        aggregator: MetricsAggregator,
        *,
        owner: int | None = None,
        server: UnixGrpcServer | None = None,
    ) -> None:
        """`server`: the socket, when it was bound beforehand (agent/launch.py)."""
        super().__init__(socket_path, server or als_socket_server(socket_path, owner))
        self.aggregator = aggregator
        # Shared by all streams: the same loggers' label sets recur on every one.
        self._decoder = HttpDecoder(peers=aggregator.peers)
        self.streams = 0
        self.malformed = 0

    def _handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "StreamAccessLogs": bytes_in(
                    grpc.stream_unary_rpc_method_handler, self._stream, StreamAccessLogsResponse
                )
            },
        )

    async def _stream(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> StreamAccessLogsResponse:
        self.streams += 1
        async for raw in requests:
            # Every entry of a message is decoded before any is counted: a message that does
            # not decode counts nothing.
            self._decoder.follow_peers()
            try:
                entries = stream_entries(raw)
                http = [self._decoder.decode(e) for e in entries.http]
                tcp = [TCPAccessLogEntry.FromString(e) for e in entries.tcp]
            except DecodeError as e:
                self.malformed += 1
                logger.info("access log stream: malformed message: %s", e)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed message: {e}")
            for observation in http:
                self.aggregator.count_http(*observation)
            for entry in tcp:
                self.aggregator.record_tcp(entry)
        return StreamAccessLogsResponse()
