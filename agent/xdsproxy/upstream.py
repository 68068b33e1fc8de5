"""The single upstream channel to the control plane.

Every stream the agent opens (Envoy's relayed ADS, proxyless clients' ADS, the agent's own
subscriptions, and CA calls) is an RPC on this one grpc.aio channel, so a pod holds one
TCP connection to the control plane. gRPC reconnects the channel itself with jittered
exponential backoff (bounded by the options below) and detects a dead peer with keepalive
pings. Several control-plane addresses are tried in order (pick_first) for failover.

With TLS (`UpstreamTls`), the control plane's certificate must chain to the given root and
name the address dialled, and every call carries the bearer token from the token file, read
again for each call (tokens are rotated by whoever writes the file).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from pilotfish_common.lifecycle import Lifecycle
from pilotfish_common.tasks import cancel
from protos.ads import DELTA_METHOD, SOTW_METHOD, identity

logger = logging.getLogger(__name__)

# The name in every control-plane replica's serving certificate (control/app.py issues it, as
# istiod's carries it): what TLS verifies when the agent is given several addresses.
REPLICA_NAME = "istiod.istio-system.svc"

# Most the upstream connection's read buffer stays at (the control plane's server uses the
# same bound; control/xds/options.py).
MAX_READ_BUFFER = 16 << 10


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


class UpstreamTlsError(OSError):
    """The TLS settings cannot be used (root certificate missing or not PEM)."""


@dataclass(frozen=True, slots=True, eq=False)
class UpstreamTls:
    """TLS to the control plane: the root it must chain to, the token sent on every call."""

    root_cert: Path  # the control plane's certificate must chain to this root
    token_file: Path | None = None  # bearer token sent on every call (None: no token)


def read_token(path: Path) -> str:
    """The token in `path`, or "" when there is none (blocking: call off the event loop)."""
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _load_root(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UpstreamTlsError(
            f"--ca-root-cert: cannot read {path}: {e.strerror or e} (the control plane's "
            "root is <state-dir>/root-cert.pem)"
        ) from None
    # Checked with the ssl module gRPC's TLS already needs, not cryptography: the channel
    # starts before the agent's heavy imports (agent/launch.py).
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=data.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError):
        raise UpstreamTlsError(f"--ca-root-cert: {path} holds no PEM certificate") from None
    return data


class UpstreamChannel(Lifecycle):
    """Owns the grpc.aio channel; hands out raw-bytes ADS calls on it."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        credentials: grpc.ChannelCredentials | None = None,
        tls: UpstreamTls | None = None,
        keepalive_time: float = 30.0,
        keepalive_timeout: float = 10.0,
        max_reconnect_backoff: float = 5.0,
    ) -> None:
        self.target = channel_target(addresses)
        self.addresses = tuple(addresses)
        self._credentials = credentials
        self._tls = tls
        self._root_pem = b""
        self._options: list[tuple[str, Any]] = [
            ("grpc.keepalive_time_ms", int(keepalive_time * 1000)),
            ("grpc.keepalive_timeout_ms", int(keepalive_timeout * 1000)),
            # What actually bounds an unanswered ping in current gRPC core (default 60 s):
            # without it a frozen control plane went unnoticed for a minute past the
            # keepalive timeout.
            ("grpc.http2.ping_timeout_ms", int(keepalive_timeout * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.min_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", int(max_reconnect_backoff * 1000)),
            ("grpc.max_receive_message_length", 256 << 20),
            ("grpc.max_send_message_length", 64 << 20),
            # One connection for everything: never let gRPC open a second subchannel pool.
            ("grpc.use_local_subchannel_pool", 1),
            # gRPC core grows a connection's read buffer to what its largest burst needed (a
            # full CDS push is megabytes) and keeps it; clamped as the control plane's server
            # clamps its own, a larger message is read in more reads of this size.
            ("grpc.experimental.tcp_max_read_buffer_size", MAX_READ_BUFFER),
            ("grpc.lb_policy_name", "pick_first"),
        ]
        if self.target.startswith(("ipv4:", "ipv6:")):
            # The authority of an `ipv4:a,b` target is the whole address list, which no
            # certificate names: TLS would fail hostname verification on every replica. The
            # name all of them carry (ours as istiod's) is checked instead.
            self._options.append(("grpc.ssl_target_name_override", REPLICA_NAME))
        self._channel: grpc.aio.Channel | None = None
        self._token = ""
        self._token_task: asyncio.Task[None] | None = None

    @property
    def tls(self) -> bool:
        """Whether calls go over TLS (see `UpstreamTls`)."""
        return self._tls is not None

    @property
    def token_file(self) -> Path | None:
        return self._tls.token_file if self._tls is not None else None

    def call_metadata(self, token: str | None = None) -> tuple[tuple[str, str], ...]:
        """`authorization: Bearer <token>` for a call over TLS (the control plane
        authenticates xDS there); `token` overrides the cached one (CA calls read the file
        afresh each time). Explicit metadata rather than gRPC call credentials: those run a
        plugin on a thread gRPC spawns per call, which costs a thread per stream and can
        deadlock with a fork (starting Envoy) under uvloop."""
        token = self._token if token is None else token
        return (("authorization", f"Bearer {token}"),) if token else ()

    async def _refresh_token(self, path: Path, interval: float = 5.0) -> None:
        """Keep the cached token current (it is rotated on disk, e.g. by the kubelet)."""
        while True:
            self._token = await asyncio.to_thread(read_token, path)
            await asyncio.sleep(interval)

    async def start(self) -> None:
        if self._tls is not None:
            self._root_pem = await asyncio.to_thread(_load_root, self._tls.root_cert)
            self._credentials = grpc.ssl_channel_credentials(root_certificates=self._root_pem)
            if self._tls.token_file is not None:
                self._token = await asyncio.to_thread(read_token, self._tls.token_file)
                self._token_task = asyncio.create_task(
                    self._refresh_token(self._tls.token_file), name="upstream-token"
                )
        if self._credentials is not None:
            self._channel = grpc.aio.secure_channel(
                self.target, self._credentials, options=self._options
            )
        else:
            self._channel = grpc.aio.insecure_channel(self.target, options=self._options)
        # Connect now (TCP and TLS handshakes run in gRPC's threads) rather than at the
        # first call: the first CSR and xDS request then find the connection up.
        self._channel.get_state(try_to_connect=True)
        logger.info("upstream channel to %s%s", self.target, " (TLS)" if self.tls else "")

    async def close(self) -> None:
        await cancel(self._token_task)
        self._token_task = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

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
        return method(wait_for_ready=True, metadata=self.call_metadata())

    def state(self) -> grpc.ChannelConnectivity:
        """The channel's state; asking also starts connecting an idle channel, so readiness
        does not wait for the first stream to bring the connection up."""
        return self.channel.get_state(try_to_connect=True)

    async def problem(self) -> str:
        """Why the channel is not READY, as precisely as can be told: its state and, over
        TLS, the outcome of a TLS handshake with the first address (gRPC only reports
        "unavailable"; an untrusted control-plane certificate should say so)."""
        state = self.state()
        reason = f"upstream channel is {state.name}"
        # Probe only a channel that has failed: while it is still connecting, a second
        # connection would only compete with it.
        if (
            state is not grpc.ChannelConnectivity.TRANSIENT_FAILURE
            or self._tls is None
            or not self._root_pem
        ):
            return reason
        tls = await self._handshake_problem(self.addresses[0])
        return f"{reason}: {tls}" if tls else reason

    async def _handshake_problem(self, address: str) -> str | None:
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        ctx = ssl.create_default_context(cadata=self._root_pem.decode())
        ctx.set_alpn_protocols(["h2"])
        try:
            async with asyncio.timeout(2.0):
                _, writer = await asyncio.open_connection(
                    host, int(port), ssl=ctx, server_hostname=host
                )
        except ssl.SSLCertVerificationError as e:
            return (
                f"control plane {address} is not trusted: {e.verify_message} (its "
                f"certificate does not chain to {self._tls.root_cert if self._tls else '?'} "
                "or does not name this address)"
            )
        except (OSError, TimeoutError) as e:
            return f"cannot reach control plane {address}: {e}"
        # Drop it at once: a graceful TLS close would wait for the server's close_notify.
        writer.transport.abort()
        return None
