"""Interception mode REDIRECT: the virtual listeners' filter chains, the routes' fallback for
hosts outside the registry, inbound ports from the services selecting the pod, and the
outbound traffic policy (mesh-wide, overridden by a Sidecar)."""

from __future__ import annotations

from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from envoy.extensions.filters.network.tcp_proxy.v3.tcp_proxy_pb2 import TcpProxy
from google.protobuf.any_pb2 import Any as AnyProto

from control.generate import GENERATORS
from control.generate.context import GenContext
from control.generate.listeners_redirect import VIRTUAL_INBOUND, VIRTUAL_OUTBOUND
from control.generate.plans import inbound_ports
from control.generate.resource_names import LISTENER_TYPE, ROUTE_TYPE
from control.model.index import MeshIndex
from control.model.proxy import Proxy, proxy_from_node
from control.model.types import (
    MeshConfig,
    MtlsMode,
    PeerAuthentication,
    Protocol,
    ServicePort,
    SidecarScope,
    SourceRef,
    labels_of,
)
from control.xds.cache import ResourceCache
from tests.integration.test_generate_envoy_validate import kube, mesh


def redirect_proxy(app: str = "reviews", sds: bool = True, mode: str = "REDIRECT") -> Proxy:
    meta: dict[str, object] = {"LABELS": {"app": app}, "INTERCEPTION_MODE": mode}
    if sds:
        meta["SDS"] = "true"
    return proxy_from_node(f"sidecar~10.0.0.9~{app}.default~default.svc.cluster.local", meta)


def listeners_of(
    config: MeshConfig, proxy: Proxy, policy: str = "ALLOW_ANY"
) -> dict[str, Listener]:
    index = MeshIndex(config, [proxy.as_workload()], outbound_traffic_policy=policy)
    out = {}
    for name, r in GENERATORS[LISTENER_TYPE](GenContext(index, ResourceCache()), proxy).items():
        out[name] = Listener.FromString(_value(r.any_bytes))
    return out


def _value(any_bytes: bytes) -> bytes:
    return AnyProto.FromString(any_bytes).value


def _cluster_of(chain: object) -> str:
    tcp = TcpProxy()
    chain.filters[-1].typed_config.Unpack(tcp)  # type: ignore[attr-defined]
    return tcp.cluster


def test_none_mode_is_unchanged() -> None:
    found = listeners_of(mesh(), redirect_proxy(mode="NONE"))
    assert VIRTUAL_OUTBOUND not in found and "10.0.0.9_9080" in found


def test_virtual_outbound_chains() -> None:
    found = listeners_of(mesh(), redirect_proxy())
    assert sorted(found) == [VIRTUAL_INBOUND, VIRTUAL_OUTBOUND]
    out = found[VIRTUAL_OUTBOUND]
    assert out.address.socket_address.address == "0.0.0.0"
    assert out.address.socket_address.port_value == 15001
    assert out.listener_filters[0].name == "envoy.filters.listener.original_dst"
    chains = {c.name: c for c in out.filter_chains}
    # HTTP ports: one chain on the port, routes by Host (RDS named after the port).
    http = chains["0.0.0.0_9080"]
    assert http.filter_chain_match.destination_port.value == 9080
    assert not http.filter_chain_match.prefix_ranges
    # Two TCP services on one port: told apart by their VIPs.
    db = [c for n, c in chains.items() if n.startswith("outbound|3306||db.")]
    cache = [c for n, c in chains.items() if n.startswith("outbound|3306||cache.")]
    assert len(db) == len(cache) == 1
    vip = kube("db", "default").addresses[0]
    assert [r.address_prefix for r in db[0].filter_chain_match.prefix_ranges] == [vip]
    assert db[0].filter_chain_match.prefix_ranges[0].prefix_len.value == 32
    # TLS by SNI; a TCP service without VIP takes its port.
    tls = chains["outbound|443||api.example.com|"]
    assert list(tls.filter_chain_match.server_names) == ["api.example.com"]
    assert chains["outbound|5000||*.any.example|"].filter_chain_match.destination_port.value == 5000
    assert "envoy.filters.listener.tls_inspector" in [f.name for f in out.listener_filters]
    assert _cluster_of(out.default_filter_chain) == "PassthroughCluster"


def test_registry_only_blackholes_unknown_destinations() -> None:
    out = listeners_of(mesh(), redirect_proxy(), "REGISTRY_ONLY")[VIRTUAL_OUTBOUND]
    assert _cluster_of(out.default_filter_chain) == "BlackHoleCluster"


def _routes(
    proxy: Proxy, policy: str, sidecars: tuple[SidecarScope, ...] = ()
) -> RouteConfiguration:
    base = mesh()
    config = MeshConfig(services=base.services, sidecars=sidecars)
    index = MeshIndex(config, [proxy.as_workload()], outbound_traffic_policy=policy)
    routes = GENERATORS[ROUTE_TYPE](GenContext(index, ResourceCache()), proxy)
    return RouteConfiguration.FromString(_value(routes["9080"].any_bytes))


def test_routes_fall_back_per_policy_only_in_redirect() -> None:
    allow = _routes(redirect_proxy(), "ALLOW_ANY").virtual_hosts[-1]
    assert (allow.name, list(allow.domains)) == ("allow_any", ["*"])
    assert allow.routes[0].route.cluster == "PassthroughCluster"
    block = _routes(redirect_proxy(), "REGISTRY_ONLY").virtual_hosts[-1]
    assert block.name == "block_all" and block.routes[0].direct_response.status == 502
    none = _routes(redirect_proxy(mode="NONE"), "REGISTRY_ONLY")
    assert all("*" not in vh.domains for vh in none.virtual_hosts)
    # A Sidecar's outboundTrafficPolicy overrides the mesh-wide one.
    sidecar = SidecarScope(
        "default",
        "all",
        SourceRef("Sidecar", "default", "all"),
        outbound_traffic_policy="REGISTRY_ONLY",
    )
    assert _routes(redirect_proxy(), "ALLOW_ANY", (sidecar,)).virtual_hosts[-1].name == "block_all"


def _strict(port_modes: tuple[tuple[int, MtlsMode], ...] = ()) -> MeshConfig:
    return MeshConfig(
        services=(
            kube("reviews", "default", ServicePort("http", 9080, Protocol.HTTP, 8080)),
            kube("reviews-db", "default", ServicePort("tcp", 3306, Protocol.TCP)),
        ),
        peer_authentications=(
            PeerAuthentication(
                "istio-system",
                "default",
                SourceRef("PeerAuthentication", "", ""),
                mode=MtlsMode.STRICT,
            ),
            PeerAuthentication(
                "default",
                "reviews",
                SourceRef("PeerAuthentication", "", ""),
                selector=labels_of({"app": "reviews"}),
                port_modes=port_modes,
            ),
        ),
    )


def test_inbound_ports_come_from_selecting_services_in_redirect() -> None:
    proxy = redirect_proxy()
    index = MeshIndex(_strict(), [proxy.as_workload()])
    ports = inbound_ports(GenContext(index, ResourceCache()), proxy)
    # reviews (target port 8080) selects app=reviews; reviews-db selects app=reviews-db.
    assert [(p.number, p.protocol, str(p.upstream)) for p in ports] == [
        (8080, Protocol.HTTP, "10.0.0.9:8080")
    ]
    none = redirect_proxy(mode="NONE")
    assert inbound_ports(GenContext(MeshIndex(_strict(), []), ResourceCache()), none) == ()


def test_virtual_inbound_chains_follow_peer_authentication() -> None:
    inbound = listeners_of(_strict(((8080, MtlsMode.PERMISSIVE),)), redirect_proxy())[
        VIRTUAL_INBOUND
    ]
    assert inbound.address.socket_address.port_value == 15006
    names = [(c.name, c.filter_chain_match.destination_port.value) for c in inbound.filter_chains]
    # The declared port is PERMISSIVE; every other port passes through under STRICT (mTLS only).
    assert names == [
        ("8080_mtls", 8080),
        ("8080_plaintext", 8080),
        ("passthrough_mtls", 0),
    ]
    assert inbound.filter_chains[-1].transport_socket.name == "envoy.transport_sockets.tls"
    assert _cluster_of(inbound.filter_chains[-1]) == "PassthroughCluster"


def test_virtual_inbound_without_certificates_refuses_strict() -> None:
    inbound = listeners_of(_strict(), redirect_proxy(sds=False))[VIRTUAL_INBOUND]
    assert list(inbound.filter_chains) == []
