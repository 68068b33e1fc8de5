"""What the send worker does per stream for a push (issue 23, target 5), counted in copies
and sorts rather than timed: the fan-out benchmark times it. A push to a thousand streams
runs `XdsServer._collect` a thousand times."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from envoy.config.core.v3.base_pb2 import Node
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest

from control.metrics import Metrics
from control.model.proxy import Proxy, proxy_from_node
from control.xds import server as server_module
from control.xds.cache import Resource, ResourceCache, ResourceSet
from control.xds.connection import Connection
from control.xds.server import XdsServer
from control.xds.sotw import SotwResponse, SotwStream
from protos import typeurls

EDS, CDS = typeurls.ENDPOINT, typeurls.CLUSTER
NODE = Node(id="sidecar~10.0.0.1~a.default~default.svc.cluster.local")


def _cla(cache: ResourceCache, rev: int) -> ResourceSet:
    def build() -> ClusterLoadAssignment:
        cla = ClusterLoadAssignment(cluster_name="a")
        cla.endpoints.add().lb_endpoints.add().endpoint.address.socket_address.address = (
            f"10.0.0.{rev}"
        )
        return cla

    return ResourceSet([cache.get(EDS, "a", rev, build)])


class _Source:
    def __init__(self) -> None:
        self.cache = ResourceCache()
        self.rev = 1
        self.returned: list[dict[str, ResourceSet]] = []

    def resources(self, proxy: Proxy, type_urls: Iterable[str]) -> dict[str, ResourceSet]:
        out = {t: _cla(self.cache, self.rev) if t == EDS else ResourceSet(()) for t in type_urls}
        self.returned.append(out)
        return out

    def push_started_at(self) -> float:
        return 0.0


class _Recording(SotwStream):
    """Records the mappings a push hands the stream."""

    __slots__ = ("given",)

    def __init__(self, stream_id: str) -> None:
        super().__init__(stream_id)
        self.given: list[Mapping[str, Mapping[str, Resource]]] = []

    def push(self, sets: Mapping[str, Mapping[str, Resource]]) -> list[SotwResponse]:
        self.given.append(sets)
        return super().push(sets)


def _request(srv: XdsServer, conn: Connection, **fields: Any) -> None:
    raw = DiscoveryRequest(**fields).SerializeToString()
    srv._handle_request(conn, DiscoveryRequest.FromString(raw), raw)


def test_a_push_hands_the_sets_over_without_a_copy_or_a_sort(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = _Source()
    srv = XdsServer(source, Metrics())
    state = _Recording("c-1")
    conn = Connection("c-1", proxy_from_node(NODE.id, {}), False, state, 0.0)
    _request(srv, conn, node=NODE, type_url=EDS, resource_names=["a"])
    assert len(srv._collect(conn)) == 1
    sorts: list[object] = []

    def counted_sorted(items: Iterable[Any], **kw: Any) -> list[Any]:
        sorts.append(items)
        return sorted(items, **kw)

    monkeypatch.setattr(server_module, "sorted", counted_sorted, raising=False)
    # An EDS-only push (the pipeline's types: EDS and the agents' peer table).
    source.rev = 2
    conn.push_pending, conn.push_types = True, frozenset((EDS, typeurls.PEER_TABLE))
    (frame,) = srv._collect(conn)
    assert frame[0] == EDS
    assert state.given[-1] is source.returned[-1]  # the source's own dict, not a copy
    assert sorts == []  # nothing forced, nothing to order
    assert conn.push_nonces is not None and EDS in conn.push_nonces
    # With a forced type (a new subscription) beside the push: the pushed sets alone go
    # to the push, the forced type is answered after it, as before.
    source.rev = 3
    _request(srv, conn, type_url=CDS)
    conn.push_pending, conn.push_types = True, frozenset((EDS,))
    frames = srv._collect(conn)
    assert [t for t, _ in frames] == [EDS, CDS]
    assert state.given[-1] is not source.returned[-1] and set(state.given[-1]) == {EDS}
    assert len(sorts) == 1
