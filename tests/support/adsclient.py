"""A minimal raw ADS client for wire-rule tests: real gRPC streams, explicit requests."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.service.discovery.v3.discovery_pb2 import (
    DeltaDiscoveryRequest,
    DeltaDiscoveryResponse,
    DiscoveryRequest,
    DiscoveryResponse,
)

SOTW = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
DELTA = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"


def node_id(ip: str, pod: str = "client", ns: str = "default") -> str:
    return f"sidecar~{ip}~{pod}.{ns}~{ns}.svc.cluster.local"


class AdsStream:
    """One ADS stream (SotW or delta) with a response queue."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        delta: bool = False,
        metadata: tuple[tuple[str, str], ...] | None = None,
    ) -> None:
        """`metadata`: call metadata, e.g. (("authorization", "Bearer <token>"),)."""
        self.delta = delta
        if delta:
            self.call: Any = channel.stream_stream(
                DELTA,
                request_serializer=DeltaDiscoveryRequest.SerializeToString,
                response_deserializer=DeltaDiscoveryResponse.FromString,
            )(metadata=metadata)
        else:
            self.call = channel.stream_stream(
                SOTW,
                request_serializer=DiscoveryRequest.SerializeToString,
                response_deserializer=DiscoveryResponse.FromString,
            )(metadata=metadata)
        self.responses: asyncio.Queue[Any] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())
        self.error: grpc.aio.AioRpcError | None = None

    async def _read(self) -> None:
        try:
            async for resp in self.call:
                await self.responses.put(resp)
        except grpc.aio.AioRpcError as e:
            self.error = e
        except asyncio.CancelledError:
            pass
        await self.responses.put(None)

    async def send(self, req: Any) -> None:
        await self.call.write(req)

    async def recv(self, timeout: float = 5.0) -> Any:
        resp = await asyncio.wait_for(self.responses.get(), timeout)
        if resp is None:
            raise AssertionError(f"stream ended: {self.error}")
        return resp

    async def expect_silence(self, seconds: float = 0.4) -> None:
        try:
            resp = await asyncio.wait_for(self.responses.get(), seconds)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected response: {resp}")

    async def close(self) -> None:
        self.call.cancel()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


def cluster_names(resp: DiscoveryResponse) -> list[str]:
    out = []
    for a in resp.resources:
        c = Cluster()
        a.Unpack(c)
        out.append(c.name)
    return out
