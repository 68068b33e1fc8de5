"""The ADS service as raw bytes: the control plane and the agent both serve it without
letting gRPC (de)serialize messages (they frame cached bytes or forward them untouched), and
the agent calls it the same way upstream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"
SOTW_METHOD = f"/{SERVICE}/StreamAggregatedResources"
DELTA_METHOD = f"/{SERVICE}/DeltaAggregatedResources"

RawStreamHandler = Callable[[AsyncIterator[bytes], grpc.aio.ServicerContext], Awaitable[None]]


def identity(b: bytes) -> bytes:
    return b


def raw_ads_handler(sotw: RawStreamHandler, delta: RawStreamHandler) -> grpc.GenericRpcHandler:
    """A generic handler serving both ADS methods with bytes in and bytes out."""
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "StreamAggregatedResources": grpc.stream_stream_rpc_method_handler(
                sotw, request_deserializer=identity, response_serializer=identity
            ),
            "DeltaAggregatedResources": grpc.stream_stream_rpc_method_handler(
                delta, request_deserializer=identity, response_serializer=identity
            ),
        },
    )
