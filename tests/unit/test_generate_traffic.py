"""What VirtualServices and DestinationRules generate: subset clusters with filtered
endpoints, policies on clusters, routes, TCP weights; which resources a change touches."""

from __future__ import annotations

import dataclasses

from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from envoy.extensions.filters.network.tcp_proxy.v3.tcp_proxy_pb2 import TcpProxy
from envoy.extensions.transport_sockets.tls.v3.tls_pb2 import UpstreamTlsContext
from google.protobuf import any_pb2
from google.protobuf.message import Message

from control.generate import GENERATORS
from control.generate.context import GenContext
from control.generate.resource_names import CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE
from control.model.index import MeshIndex
from control.model.proxy import Proxy, proxy_from_node
from control.model.types import MeshConfig, Workload
from control.pipeline import _shape
from control.xds.cache import ResourceCache, ResourceSet
from tests.support.traffic import (
    header_route,
    service,
    subsets_rule,
    tcp_split,
    workload_entry,
)
from tests.support.traffic import mesh_config as config


def base(r1_version: str = "v1") -> str:
    """reviews (two versions) and db (two versions) behind their Services."""
    return "".join(
        (
            service("reviews", "reviews"),
            service("db", "db", 3306, None, "tcp"),
            workload_entry("r1", "10.0.0.1", app="reviews", version=r1_version),
            workload_entry("r2", "10.0.0.2", app="reviews", version="v2"),
            workload_entry("db1", "10.0.0.3", app="db", version="v1"),
            workload_entry("db2", "10.0.0.4", app="db", version="v2"),
        )
    )


BASE = base()

RULES = (
    """
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews
  trafficPolicy: {loadBalancer: {simple: LEAST_REQUEST}}
  subsets:
  - {name: v1, labels: {version: v1}}
  - name: v2
    labels: {version: v2}
    trafficPolicy: {loadBalancer: {consistentHash: {httpHeaderName: x-user}}}
"""
    + subsets_rule("db")
    + tcp_split("db", {"v1": 70, "v2": 30})
)

VS = header_route("reviews")

# A DestinationRule in the client's namespace wins over the service's (Istio's lookup order).
CLIENT_SIDE_RULE = """
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews-from-shop, namespace: shop}
spec:
  host: reviews.default.svc.cluster.local
  trafficPolicy: {loadBalancer: {simple: RANDOM}}
"""


def proxy(ns: str = "default") -> Proxy:
    return proxy_from_node(f"sidecar~10.1.0.1~client.{ns}~{ns}.svc.cluster.local", {})


def generate(
    cfg: MeshConfig, p: Proxy, cache: ResourceCache | None = None, extra: tuple[Workload, ...] = ()
) -> dict[str, ResourceSet]:
    ctx = GenContext(MeshIndex(cfg, extra), cache if cache is not None else ResourceCache())
    return {
        t: GENERATORS[t](ctx, p) for t in (CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE)
    }


def unpack(resource_set: ResourceSet, name: str, cls: type[Message]) -> Message:
    wrapped = any_pb2.Any()
    wrapped.ParseFromString(resource_set[name].any_bytes)
    msg = cls()
    assert wrapped.Unpack(msg)
    return msg


V1 = "outbound|9080|v1|reviews.default.svc.cluster.local"
V2 = "outbound|9080|v2|reviews.default.svc.cluster.local"
BASE_CLUSTER = "outbound|9080||reviews.default.svc.cluster.local"


def test_subsets_are_clusters_with_filtered_endpoints_and_merged_policy() -> None:
    sets = generate(config(BASE, RULES), proxy())
    assert {V1, V2, BASE_CLUSTER} <= set(sets[CLUSTER_TYPE])
    addresses = {
        name: [
            e.endpoint.address.socket_address.address
            for group in unpack(sets[ENDPOINT_TYPE], name, ClusterLoadAssignment).endpoints  # type: ignore[attr-defined]
            for e in group.lb_endpoints
        ]
        for name in (V1, V2, BASE_CLUSTER)
    }
    assert addresses == {V1: ["10.0.0.1"], V2: ["10.0.0.2"], BASE_CLUSTER: ["10.0.0.1", "10.0.0.2"]}
    v1 = unpack(sets[CLUSTER_TYPE], V1, Cluster)
    v2 = unpack(sets[CLUSTER_TYPE], V2, Cluster)
    assert v1.lb_policy == Cluster.LEAST_REQUEST  # type: ignore[attr-defined]
    assert v2.lb_policy == Cluster.RING_HASH  # type: ignore[attr-defined]
    # No VirtualService: one default route to the service cluster, whose policy (unlike
    # subset v2's) has no consistent hash, so the route has no hash policy.
    routes = unpack(sets[ROUTE_TYPE], "9080", RouteConfiguration)
    (vhost,) = routes.virtual_hosts  # type: ignore[attr-defined]
    assert [r.name for r in vhost.routes] == ["default"]
    assert vhost.routes[0].route.cluster == BASE_CLUSTER
    assert not vhost.routes[0].route.hash_policy


def test_virtual_service_routes_and_weighted_tcp() -> None:
    sets = generate(config(BASE, RULES, VS), proxy())
    routes = unpack(sets[ROUTE_TYPE], "9080", RouteConfiguration)
    (vhost,) = routes.virtual_hosts  # type: ignore[attr-defined]
    assert [r.route.cluster for r in vhost.routes] == [V2, V1]
    assert vhost.routes[0].match.headers[0].name == "end-user"
    assert vhost.routes[0].route.hash_policy[0].header.header_name == "x-user"
    listener = unpack(sets[LISTENER_TYPE], "10.1.0.1_3306", Listener)
    tcp = TcpProxy()
    assert listener.filter_chains[0].filters[0].typed_config.Unpack(tcp)  # type: ignore[attr-defined]
    assert [(c.name, c.weight) for c in tcp.weighted_clusters.clusters] == [
        ("outbound|3306|v1|db.default.svc.cluster.local", 70),
        ("outbound|3306|v2|db.default.svc.cluster.local", 30),
    ]


def test_client_namespace_rule_applies_to_that_namespace_only() -> None:
    cfg = config(BASE, RULES, CLIENT_SIDE_RULE)
    cache = ResourceCache()
    default = generate(cfg, proxy("default"), cache)
    shop = generate(cfg, proxy("shop"), cache)
    other = generate(cfg, proxy("other"), cache)
    assert unpack(default[CLUSTER_TYPE], BASE_CLUSTER, Cluster).lb_policy == Cluster.LEAST_REQUEST  # type: ignore[attr-defined]
    assert unpack(shop[CLUSTER_TYPE], BASE_CLUSTER, Cluster).lb_policy == Cluster.RANDOM  # type: ignore[attr-defined]
    # The shop rule has no subsets: shop's clients get none.
    assert V1 not in shop[CLUSTER_TYPE] and V1 in other[CLUSTER_TYPE]
    # Clients of namespaces without rules of their own share the same bytes.
    assert other[CLUSTER_TYPE][V1] is default[CLUSTER_TYPE][V1]


def test_a_change_touches_what_it_affects() -> None:
    cache = ResourceCache()
    before = generate(config(BASE, RULES), proxy(), cache)
    after_vs = generate(config(BASE, RULES, VS), proxy(), cache)
    # A VirtualService changes routes only.
    assert after_vs[CLUSTER_TYPE].versions() == before[CLUSTER_TYPE].versions()
    assert after_vs[ENDPOINT_TYPE].versions() == before[ENDPOINT_TYPE].versions()
    assert after_vs[ROUTE_TYPE]["9080"].version != before[ROUTE_TYPE]["9080"].version
    # A workload relabelled v1 -> v2 moves between subset assignments: EDS only.
    moved = config(base(r1_version="v2"), RULES, VS)
    after_move = generate(moved, proxy(), cache)
    assert after_move[CLUSTER_TYPE].versions() == after_vs[CLUSTER_TYPE].versions()
    assert after_move[ROUTE_TYPE].versions() == after_vs[ROUTE_TYPE].versions()
    changed = {
        n
        for n, v in after_move[ENDPOINT_TYPE].versions().items()
        if after_vs[ENDPOINT_TYPE].versions()[n] != v
    }
    assert changed == {V1, V2}
    # The control plane pushes everything (not EDS only) when rules change.
    assert _shape(config(BASE, RULES)) != _shape(config(BASE, RULES, VS))
    assert _shape(config(BASE, RULES, VS)) == _shape(moved)


def test_tls_settings_override_auto_mtls() -> None:
    rule = """
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews
  trafficPolicy: {tls: {mode: DISABLE}}
  subsets:
  - name: v1
    labels: {version: v1}
    trafficPolicy: {tls: {mode: SIMPLE, caCertificates: /etc/ca.pem, sni: r.example}}
"""
    sds_proxy = proxy_from_node(
        "sidecar~10.1.0.1~client.default~default.svc.cluster.local", {"SDS": "true"}
    )
    plain = generate(config(BASE), sds_proxy)
    auto = unpack(plain[CLUSTER_TYPE], BASE_CLUSTER, Cluster)
    assert len(auto.transport_socket_matches) == 2  # type: ignore[attr-defined]
    sets = generate(config(BASE, rule), sds_proxy)
    disabled = unpack(sets[CLUSTER_TYPE], BASE_CLUSTER, Cluster)
    assert not disabled.transport_socket_matches and not disabled.HasField("transport_socket")  # type: ignore[attr-defined]
    simple = unpack(sets[CLUSTER_TYPE], V1, Cluster)
    context = UpstreamTlsContext()
    assert simple.transport_socket.typed_config.Unpack(context)  # type: ignore[attr-defined]
    assert context.sni == "r.example"
    assert context.common_tls_context.validation_context.trusted_ca.filename == "/etc/ca.pem"


def test_unchanged_config_rebuilds_nothing() -> None:
    cache = ResourceCache()
    cfg = config(BASE, RULES, VS)
    generate(cfg, proxy(), cache)
    made = cache.serializations
    generate(dataclasses.replace(cfg), proxy(), cache)
    assert cache.serializations == made
