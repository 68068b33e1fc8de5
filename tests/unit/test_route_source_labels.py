"""VirtualService `match[].sourceLabels`: a match applies to the sidecars whose workload has
those labels, so two clients in one namespace get different routes. Clients that satisfy the
same selectors share one route table (the RDS memo key holds which selectors a client
satisfies, not its labels). At gateways a `sourceLabels` match never applies (said at load)."""

from __future__ import annotations

import textwrap

from envoy.config.route.v3.route_pb2 import RouteConfiguration
from google.protobuf.any_pb2 import Any as AnyProto

from control.generate import GENERATORS
from control.generate.context import GenContext
from control.generate.resource_names import ROUTE_TYPE
from control.model.index import MeshIndex
from control.model.proxy import Proxy, proxy_from_node
from control.model.types import MeshConfig
from control.xds.cache import ResourceCache
from tests.support.traffic import mesh_config, service, subsets_rule, workload_entry

VS = textwrap.dedent(
    """
    ---
    apiVersion: networking.istio.io/v1
    kind: VirtualService
    metadata: {name: reviews, namespace: default}
    spec:
      hosts: [reviews]
      http:
      - match: [{sourceLabels: {app: canary-client}}]
        route: [{destination: {host: reviews, subset: v2}}]
      - route: [{destination: {host: reviews, subset: v1}}]
    """
)


def _config(*extra: str) -> MeshConfig:
    return mesh_config(
        service("reviews", "reviews"),
        workload_entry("reviews-v1", "127.0.3.1", app="reviews", version="v1"),
        workload_entry("reviews-v2", "127.0.3.2", app="reviews", version="v2"),
        subsets_rule("reviews"),
        VS,
        *extra,
    )


def _client(name: str, **labels: str) -> Proxy:
    return proxy_from_node(
        f"sidecar~127.0.4.1~{name}.default~default.svc.cluster.local", {"LABELS": labels}
    )


def _routes(ctx: GenContext, proxy: Proxy) -> tuple[list[str], bytes]:
    """The reviews routes' clusters for `proxy`, and the route table's bytes."""
    found = GENERATORS[ROUTE_TYPE](ctx, proxy)["9080"]
    table = RouteConfiguration.FromString(AnyProto.FromString(found.any_bytes).value)
    (vhost,) = [v for v in table.virtual_hosts if v.name.startswith("reviews.")]
    return [r.route.cluster for r in vhost.routes], found.any_bytes


V1 = "outbound|9080|v1|reviews.default.svc.cluster.local"
V2 = "outbound|9080|v2|reviews.default.svc.cluster.local"


def test_source_labels_pick_the_route_per_client() -> None:
    config = _config()
    assert [str(w) for w in config.warnings] == []
    ctx = GenContext(MeshIndex(config, []), ResourceCache())
    canary, canary_bytes = _routes(ctx, _client("c1", app="canary-client", version="x"))
    plain, plain_bytes = _routes(ctx, _client("p1", app="productpage"))
    other, other_bytes = _routes(ctx, _client("p2", app="ratings", tier="back"))
    assert canary == [V2, V1]  # its match applies first, the catch-all after it
    assert plain == other == [V1]  # the match does not exist for them
    assert plain_bytes == other_bytes != canary_bytes


def test_clients_without_source_selectors_in_the_mesh_share_the_table() -> None:
    config = mesh_config(service("reviews", "reviews"), subsets_rule("reviews"))
    ctx = GenContext(MeshIndex(config, []), ResourceCache())
    one = GENERATORS[ROUTE_TYPE](ctx, _client("a", app="a"))
    two = GENERATORS[ROUTE_TYPE](ctx, _client("b", app="b"))
    assert one is two  # one memo entry for both: their labels did not enter its key


def test_at_gateways_a_source_labels_match_is_dropped_and_said() -> None:
    gateway_vs = textwrap.dedent(
        """
        ---
        apiVersion: networking.istio.io/v1
        kind: VirtualService
        metadata: {name: edge, namespace: default}
        spec:
          hosts: [shop.example.com]
          gateways: [mesh, edge/public]
          http:
          - match: [{sourceLabels: {app: canary-client}}]
            route: [{destination: {host: reviews, subset: v2}}]
        """
    )
    config = _config(gateway_vs)
    assert [w.message for w in config.warnings] == [
        "spec.http[0]: sourceLabels selects sidecars only; at gateways the match is dropped"
    ]
