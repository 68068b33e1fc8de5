"""Read-only views of the open ADS streams: syncz (as JSON for /debug/syncz, and as CSDS
`ClientConfig` resources for `istio.io/debug/syncz` over xDS, as Istio serves it) and the
connection list. What a row says, and which proxy a debug request names, is decided here; the
xDS server only owns the streams.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from envoy.service.status.v3 import csds_pb2

from control.ca.identity import Identity
from control.model.proxy import Proxy
from control.xds.cache import Resource, ResourceSet, digest
from control.xds.state import TypeStatus
from protos import typeurls, wire

_CLIENT_CONFIG = "type.googleapis.com/envoy.service.status.v3.ClientConfig"
# The syncz entries a caller of syncz over xDS may see (None: an unauthenticated caller);
# control/debugaccess.py's DebugPolicy.visible_syncz.
SynczFilter = Callable[[list[dict[str, Any]], Identity | None], list[dict[str, Any]]]


class Subscriptions(Protocol):
    """A stream's state machine, as far as the views read it: the types it subscribed to
    (read-only)."""

    @property
    def subscribed_types(self) -> list[str]: ...


class Stream(Protocol):
    """One open ADS stream as the views read it (the xDS server's `Connection`).

    Contract: read-only; `status()` is one row per type the stream has seen, and `peer` is
    "" once the stream is gone. The views never write to a stream."""

    @property
    def id(self) -> str: ...

    @property
    def proxy(self) -> Proxy: ...

    @property
    def delta(self) -> bool: ...

    @property
    def connected_at(self) -> float: ...

    @property
    def peer(self) -> str: ...

    @property
    def state(self) -> Subscriptions: ...

    def status(self) -> list[TypeStatus]: ...


class StreamTable(Protocol):
    """The open streams by id (the xDS server). Contract: the mapping is only read, on the
    event loop, and not kept: each view call reads it afresh."""

    @property
    def connections(self) -> Mapping[str, Stream]: ...


def syncz(streams: Iterable[Stream], control_plane_id: str) -> list[dict[str, Any]]:
    """One entry per stream, by stream id; the syncz type itself is not a row."""
    out = []
    for conn in sorted(streams, key=lambda c: c.id):
        out.append(
            {
                "proxy": conn.proxy.id,
                "namespace": conn.proxy.namespace,
                "stream": conn.id,
                "istiod": control_plane_id,
                "protocol": "delta" if conn.delta else "sotw",
                "types": {
                    s.type_url: {
                        "status": s.status.value,
                        "sent_version": s.sent_version,
                        "sent_nonce": s.sent_nonce,
                        "acked_nonce": s.acked_nonce,
                        "last_nack": s.last_nack,
                        "resources": s.resource_count,
                    }
                    for s in conn.status()
                    if s.type_url != typeurls.DEBUG_SYNCZ
                },
            }
        )
    return out


def syncz_resources(
    streams: Iterable[Stream],
    control_plane_id: str,
    caller: Identity | None = None,
    syncz_filter: SynczFilter | None = None,
) -> ResourceSet:
    """syncz as xDS resources (envoy.service.status.v3.ClientConfig, as Istio serves it),
    one per stream, named by stream id: those `syncz_filter` lets `caller` see."""
    out: list[Resource] = []
    entries = syncz(streams, control_plane_id)
    if syncz_filter is not None:
        entries = syncz_filter(entries, caller)
    for entry in entries:
        cc = csds_pb2.ClientConfig()
        cc.node.id = entry["proxy"]
        cc.node.metadata.update({"CONTROL_PLANE_ID": entry["istiod"], "STREAM": entry["stream"]})
        for t, row in entry["types"].items():
            g = cc.generic_xds_configs.add()
            g.type_url = t
            g.version_info = row["sent_version"]
            g.config_status = csds_pb2.ConfigStatus.Value(row["status"])
            if row["last_nack"]:
                g.error_state.details = row["last_nack"]
        value = cc.SerializeToString(deterministic=True)
        framed = wire.any_bytes(_CLIENT_CONFIG, value)
        out.append(Resource(entry["stream"], digest(value), _CLIENT_CONFIG, framed))
    return ResourceSet(out)


def connections(streams: Iterable[Stream]) -> list[dict[str, Any]]:
    """/debug/connections: who is connected, from where, subscribed to what."""
    return [
        {
            "id": c.id,
            "proxy": c.proxy.id,
            "ip": c.proxy.ip,
            "namespace": c.proxy.namespace,
            "peer": c.peer,
            "protocol": "delta" if c.delta else "sotw",
            "connected_at": c.connected_at,
            "subscribed": sorted(c.state.subscribed_types),
        }
        for c in sorted(streams, key=lambda c: c.id)
    ]


class StreamViews:
    """The views above over a live stream table, for the debug server and tests."""

    def __init__(self, table: StreamTable, control_plane_id: str) -> None:
        self._table = table
        self._id = control_plane_id

    def syncz(self) -> list[dict[str, Any]]:
        return syncz(self._table.connections.values(), self._id)

    def connections(self) -> list[dict[str, Any]]:
        return connections(self._table.connections.values())

    def proxy(self, name: str) -> Proxy | None:
        """The connected proxy that `name` means: its node id, or `pod.namespace` as
        pilotfish-ctl spells it; None when none is connected."""
        return next(
            (
                c.proxy
                for c in self._table.connections.values()
                if name in (c.proxy.id, f"{c.proxy.pod_name}.{c.proxy.namespace}")
            ),
            None,
        )
