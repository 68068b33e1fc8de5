"""`pilotfish-ctl proxy-status`: syncz from every control-plane replica, merged into one view.

Each replica serves its syncz over ADS for type URL `istio.io/debug/syncz` as
envoy.service.status.v3.ClientConfig resources (one per stream, the replica's id in node
metadata CONTROL_PLANE_ID), which is how istioctl reaches every istiod. `fetch_syncz` is the
thin grpc.aio adapter; `proxy_rows` (sans-IO) folds the streams of one proxy into one row.

Over the TLS port (15012) the replica wants what an agent presents: a bearer token (ours from
`pilotfish-ctl token`, or a Kubernetes service-account token with audience istio-ca), and the
stream may only claim the token's own namespace and service account, so our node says those.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest, DiscoveryResponse
from envoy.service.status.v3 import csds_pb2

from protos import typeurls
from protos.ads import SOTW_METHOD

# The columns of the table, in Istio's order plus our name table.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("CDS", typeurls.CLUSTER),
    ("LDS", typeurls.LISTENER),
    ("EDS", typeurls.ENDPOINT),
    ("RDS", typeurls.ROUTE),
    ("NDS", typeurls.NAME_TABLE),
)

# Worst first: when two streams of one proxy report a type, the worse state is shown.
_SEVERITY = {"ERROR": 0, "STALE": 1, "NOT_SENT": 2, "SYNCED": 3, "UNKNOWN": 4}


class ReplicaError(Exception):
    """A replica could not be asked (unreachable, refused, or did not answer in time)."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"{address}: {reason}")
        self.address = address


@dataclass(frozen=True, slots=True)
class StreamStatus:
    """One ClientConfig: one xDS stream on one replica."""

    proxy: str  # node id
    replica: str  # the replica's --id
    stream: str
    types: dict[str, tuple[str, str, str]]  # type url -> (state, version, NACK detail)


@dataclass(slots=True)
class ProxyRow:
    proxy: str
    replica: str
    states: dict[str, str] = field(default_factory=dict)  # short name -> state
    versions: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    streams: int = 0

    @property
    def name(self) -> str:
        """pod.namespace, as istioctl shows it (the node id when it has another form)."""
        parts = self.proxy.split("~")
        return parts[2] if len(parts) == 4 else self.proxy

    @property
    def ip(self) -> str:
        parts = self.proxy.split("~")
        return parts[1] if len(parts) == 4 else ""

    def as_json(self) -> dict[str, object]:
        return {
            "proxy": self.proxy,
            "name": self.name,
            "ip": self.ip,
            "replica": self.replica,
            "streams": self.streams,
            "types": {
                short: {
                    "state": self.states[short],
                    "version": self.versions.get(short, ""),
                    "error": self.errors.get(short, ""),
                }
                for short in self.states
            },
        }


def decode_syncz(response: DiscoveryResponse, fallback_replica: str) -> list[StreamStatus]:
    out: list[StreamStatus] = []
    for any_msg in response.resources:
        cc = csds_pb2.ClientConfig()
        if not any_msg.Unpack(cc):
            continue
        meta = cc.node.metadata.fields
        replica = meta["CONTROL_PLANE_ID"].string_value if "CONTROL_PLANE_ID" in meta else ""
        stream = meta["STREAM"].string_value if "STREAM" in meta else ""
        types = {
            g.type_url: (
                csds_pb2.ConfigStatus.Name(g.config_status),
                g.version_info,
                g.error_state.details,
            )
            for g in cc.generic_xds_configs
        }
        out.append(StreamStatus(cc.node.id, replica or fallback_replica, stream, types))
    return out


def proxy_rows(streams: Iterable[StreamStatus], exclude: Iterable[str] = ()) -> list[ProxyRow]:
    """One row per (proxy, replica): an agent's Envoy stream and its own stream (NDS) are
    one proxy. Streams that subscribe to nothing we show (other pilotfish-ctl runs) and the
    node ids in `exclude` are left out."""
    skip = set(exclude)
    rows: dict[tuple[str, str], ProxyRow] = {}
    for s in streams:
        if s.proxy in skip or not s.types:
            continue
        row = rows.setdefault((s.proxy, s.replica), ProxyRow(s.proxy, s.replica))
        row.streams += 1
        for short, type_url in COLUMNS:
            if type_url not in s.types:
                continue
            state, version, error = s.types[type_url]
            old = row.states.get(short)
            if old is None or _SEVERITY.get(state, 9) < _SEVERITY.get(old, 9):
                row.states[short] = state
                row.versions[short] = version
                if error:
                    row.errors[short] = error
    return sorted(rows.values(), key=lambda r: (r.name, r.proxy, r.replica))


def table_rows(rows: Sequence[ProxyRow]) -> tuple[list[str], list[list[str]]]:
    headers = ["NAME", "IP", "REPLICA", *(short for short, _ in COLUMNS)]
    body = [
        [
            r.name,
            r.ip,
            r.replica,
            *(r.states.get(short, "-").replace("_", " ") for short, _ in COLUMNS),
        ]
        for r in rows
    ]
    return headers, body


def ctl_node_id(namespace: str = "default") -> str:
    """Our own node id: a form the control plane accepts, marked so we can hide our stream."""
    return (
        f"pilotfish-ctl~127.0.0.1~pilotfish-ctl-{os.getpid()}.{namespace}~"
        f"{namespace}.svc.cluster.local"
    )


class TokenError(ValueError):
    """The bearer token does not name a namespace and service account."""


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """How to reach replicas on their TLS xDS port."""

    root_pem: bytes  # the mesh root the replica's serving certificate chains to
    token: str = ""  # bearer token (our own or a Kubernetes service-account token)
    # The name its certificate carries: replicas found by pod IP are not named by their IP.
    server_name: str = "istiod.istio-system.svc"

    def identity(self) -> tuple[str, str]:
        return token_identity(self.token) if self.token else ("default", "default")


def token_identity(token: str) -> tuple[str, str]:
    """(namespace, service account) a JWT names in `sub`, read, not verified: the replica
    verifies it; we only need to claim the same identity on our stream."""
    try:
        payload = token.strip().split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        parts = str(claims.get("sub", "")).split(":")
    except (IndexError, ValueError, AttributeError):
        raise TokenError("the token is not a JWT") from None
    if len(parts) != 4 or parts[:2] != ["system", "serviceaccount"]:
        raise TokenError("the token's subject is not system:serviceaccount:<ns>:<name>")
    return parts[2], parts[3]


def _channel(address: str, tls: TlsOptions | None) -> grpc.aio.Channel:
    if tls is None:
        return grpc.aio.insecure_channel(address)
    creds = grpc.ssl_channel_credentials(root_certificates=tls.root_pem)
    options = [("grpc.ssl_target_name_override", tls.server_name)] if tls.server_name else []
    return grpc.aio.secure_channel(address, creds, options=options)


async def fetch_syncz(
    address: str, timeout: float = 5.0, tls: TlsOptions | None = None
) -> list[StreamStatus]:
    """Ask one replica for its syncz (plaintext, or TLS with a token); raises ReplicaError."""
    namespace, service_account = tls.identity() if tls is not None else ("default", "default")
    request = DiscoveryRequest(type_url=typeurls.DEBUG_SYNCZ)
    request.node.id = ctl_node_id(namespace)
    # Never registered as a workload, so asking does not change what it reports.
    request.node.metadata.update(
        {"AUTO_REGISTER": "false", "NAMESPACE": namespace, "SERVICE_ACCOUNT": service_account}
    )
    metadata = (("authorization", f"Bearer {tls.token}"),) if tls and tls.token else None
    async with _channel(address, tls) as channel:
        call = channel.stream_stream(
            SOTW_METHOD,
            request_serializer=DiscoveryRequest.SerializeToString,
            response_deserializer=DiscoveryResponse.FromString,
        )(metadata=metadata)
        try:
            async with asyncio.timeout(timeout):
                await call.write(request)
                response = await call.read()
        except TimeoutError:
            raise ReplicaError(address, f"no answer within {timeout:g}s") from None
        except grpc.aio.AioRpcError as e:
            raise ReplicaError(address, f"{e.code().name}: {e.details()}") from None
        finally:
            call.cancel()
    if response is grpc.aio.EOF or not isinstance(response, DiscoveryResponse):
        raise ReplicaError(address, "stream closed without an answer")
    return decode_syncz(response, address)


async def gather_status(
    addresses: Sequence[str], timeout: float = 5.0, tls: TlsOptions | None = None
) -> tuple[list[ProxyRow], list[ReplicaError]]:
    """Ask every replica at once; the rows from those that answered, and the failures."""
    results = await asyncio.gather(
        *(fetch_syncz(a, timeout, tls) for a in addresses), return_exceptions=True
    )
    streams: list[StreamStatus] = []
    errors: list[ReplicaError] = []
    for address, result in zip(addresses, results, strict=True):
        if isinstance(result, ReplicaError):
            errors.append(result)
        elif isinstance(result, BaseException):
            errors.append(ReplicaError(address, str(result) or type(result).__name__))
        else:
            streams.extend(result)
    namespace = tls.identity()[0] if tls is not None else "default"
    return proxy_rows(streams, exclude=(ctl_node_id(namespace),)), errors
