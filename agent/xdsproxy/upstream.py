"""The single upstream channel to the control plane.

Every stream the agent opens (Envoy's relayed ADS, proxyless clients' ADS, the agent's own
subscriptions, and later CA calls) is an RPC on this one grpc.aio channel, so a pod holds one
TCP connection to the control plane. gRPC reconnects the channel itself with jittered
exponential backoff (bounded by the options below) and detects a dead peer with keepalive
pings. Several control-plane addresses are tried in order (pick_first) for failover.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import grpc

from protos.ads import DELTA_METHOD, SOTW_METHOD, identity

logger = logging.getLogger(__name__)


def channel_target(addresses: Sequence[str]) -> str:
    """A gRPC target that fails over between addresses (IP literals use the ipv4:/ipv6:
    resolvers, names use dns:)."""
    if len(addresses) == 1:
        return addresses[0]
    hosts = [a.rpartition(":")[0].strip("[]") for a in addresses]
    if all(_is_ipv4(h) for h in hosts):
        return "ipv4:" + ",".join(addresses)
    if all(":" in h for h in hosts):
        return "ipv6:" + ",".join(addresses)
    return addresses[0]


def _is_ipv4(host: str) -> bool:
    parts = host.split(".")
    return len(parts) == 4 and all(p.isdigit() for p in parts)


class UpstreamChannel:
    """Owns the grpc.aio channel; hands out raw-bytes ADS calls on it."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        credentials: grpc.ChannelCredentials | None = None,
        keepalive_time: float = 30.0,
        keepalive_timeout: float = 10.0,
        max_reconnect_backoff: float = 5.0,
    ) -> None:
        self.target = channel_target(addresses)
        self._credentials = credentials
        self._options: list[tuple[str, Any]] = [
            ("grpc.keepalive_time_ms", int(keepalive_time * 1000)),
            ("grpc.keepalive_timeout_ms", int(keepalive_timeout * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.min_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", int(max_reconnect_backoff * 1000)),
            ("grpc.max_receive_message_length", 256 << 20),
            ("grpc.max_send_message_length", 64 << 20),
            # One connection for everything: never let gRPC open a second subchannel pool.
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.lb_policy_name", "pick_first"),
        ]
        self._channel: grpc.aio.Channel | None = None

    async def start(self) -> None:
        if self._credentials is not None:
            self._channel = grpc.aio.secure_channel(
                self.target, self._credentials, options=self._options
            )
        else:
            self._channel = grpc.aio.insecure_channel(self.target, options=self._options)
        logger.info("upstream channel to %s", self.target)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def __aenter__(self) -> UpstreamChannel:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            raise RuntimeError("upstream channel is not started")
        return self._channel

    def ads(self, *, delta: bool) -> grpc.aio.StreamStreamCall:
        """A new ADS stream carrying raw bytes both ways (nothing is re-serialized). It waits
        for the channel to be ready, so a stream opened while the control plane is away
        starts as soon as it returns instead of failing at once."""
        method = self.channel.stream_stream(
            DELTA_METHOD if delta else SOTW_METHOD,
            request_serializer=identity,
            response_deserializer=identity,
        )
        return method(wait_for_ready=True)

    def state(self) -> grpc.ChannelConnectivity:
        """The channel's state; asking also starts connecting an idle channel, so readiness
        does not wait for the first stream to bring the connection up."""
        return self.channel.get_state(try_to_connect=True)
