"""Envoy's gRPC access log service (`envoy.service.accesslog.v3.AccessLogService`) on
`<workdir>/ALS`: the generated loggers stream every request and TCP connection here, and each
entry goes into the `MetricsAggregator`.

The socket is 0600 (owned by Envoy's user when it runs as another): what arrives on it becomes
metrics, so only Envoy may connect. A message that does not decode ends its stream with
INVALID_ARGUMENT (Envoy reconnects); nothing else is lost.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from envoy.service.accesslog.v3.als_pb2 import StreamAccessLogsMessage, StreamAccessLogsResponse
from google.protobuf.message import DecodeError

from agent.telemetry.aggregator import MetricsAggregator
from agent.unixsocket import UnixGrpcServer, als_socket_server
from pilotfish_common.lifecycle import Lifecycle

logger = logging.getLogger(__name__)

SERVICE = "envoy.service.accesslog.v3.AccessLogService"


class AccessLogServer(Lifecycle):
    def __init__(
        self,
        socket_path: Path,
        aggregator: MetricsAggregator,
        *,
        owner: int | None = None,
        server: UnixGrpcServer | None = None,
    ) -> None:
        """`server`: the socket, when it was bound beforehand (agent/launch.py)."""
        self.socket_path = socket_path
        self.aggregator = aggregator
        self._server = server or als_socket_server(socket_path, owner)
        self.streams = 0
        self.malformed = 0

    async def start(self) -> None:
        await self._server.start(
            grpc.method_handlers_generic_handler(
                SERVICE,
                {
                    # Bytes in, decoded here: a DecodeError in a deserializer would escape into
                    # gRPC instead of ending the stream cleanly.
                    "StreamAccessLogs": grpc.stream_unary_rpc_method_handler(
                        self._stream,
                        request_deserializer=None,
                        response_serializer=StreamAccessLogsResponse.SerializeToString,
                    )
                },
            )
        )
        logger.info("access log service listening on %s", self.socket_path)

    async def close(self, grace: float = 0.5) -> None:
        await self._server.close(grace)

    async def _stream(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> StreamAccessLogsResponse:
        self.streams += 1
        async for raw in requests:
            # A fresh message each time: a reused one keeps every parse's memory (its arena
            # only grows), which would grow with traffic.
            message = StreamAccessLogsMessage()
            try:
                message.ParseFromString(raw)
            except DecodeError as e:
                self.malformed += 1
                logger.info("access log stream: malformed message: %s", e)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed message: {e}")
            for http in message.http_logs.log_entry:
                self.aggregator.record_http(http)
            for tcp in message.tcp_logs.log_entry:
                self.aggregator.record_tcp(tcp)
        return StreamAccessLogsResponse()
