"""VirtualService `match[].sourceLabels`: a match applies to the sidecars whose workload has
those labels, so two clients in one namespace get different routes. Clients that satisfy the
same selectors share one route table (the RDS memo key holds which selectors a client
satisfies, not its labels). At a gateway the client is the router: a match applies when the
router pod's own labels satisfy it, as in Istio."""

from __future__ import annotations

import textwrap

import pytest
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from google.protobuf.any_pb2 import Any as AnyProto

from control.generate import GENERATORS, ROUTER_GENERATORS
from control.generate.context import GenContext, next_context
from control.generate.resource_names import ROUTE_TYPE
from control.model.index import MeshIndex
from control.model.proxy import Proxy, proxy_from_node
from control.model.types import MeshConfig
from control.xds.cache import Resource, ResourceCache
from tests.support.gateways import router
from tests.support.traffic import (
    count_translations,
    mesh_config,
    service,
    subsets_rule,
    workload_entry,
)

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


# A Gateway selecting every ingress router and a VirtualService bound to it only (sidecars
# never see it) whose first match is for routers labelled zone=canary only.
GATEWAY_VS = textwrap.dedent(
    """
    ---
    apiVersion: networking.istio.io/v1
    kind: Gateway
    metadata: {name: public, namespace: edge}
    spec:
      selector: {istio: ingressgateway}
      servers:
      - port: {number: 80, name: http, protocol: HTTP}
        hosts: [shop.example.com]
    ---
    apiVersion: networking.istio.io/v1
    kind: VirtualService
    metadata: {name: edge, namespace: default}
    spec:
      hosts: [shop.example.com]
      gateways: [edge/public]
      http:
      - match: [{sourceLabels: {zone: canary}}]
        route: [{destination: {host: reviews, subset: v2}}]
      - route: [{destination: {host: reviews, subset: v1}}]
    """
)


def _sidecar_only_vs(name: str, selector: str) -> str:
    """A VirtualService for sidecars only, whose one match has the `sourceLabels` `selector`:
    it changes which selectors the mesh has, not what any router is sent."""
    return textwrap.dedent(
        f"""
        ---
        apiVersion: networking.istio.io/v1
        kind: VirtualService
        metadata: {{name: {name}, namespace: default}}
        spec:
          hosts: [ratings]
          http:
          - match: [{{sourceLabels: {{{selector}}}}}]
            route: [{{destination: {{host: reviews}}}}]
        """
    )


def _router(**labels: str) -> Proxy:
    return router({"istio": "ingressgateway", **labels}, namespace="edge")


def _gateway_routes(ctx: GenContext, proxy: Proxy) -> tuple[list[str], Resource]:
    """The shop host's routes' clusters at router `proxy`, and its route table."""
    found = ROUTER_GENERATORS[ROUTE_TYPE](ctx, proxy)["http.80"]
    table = RouteConfiguration.FromString(AnyProto.FromString(found.any_bytes).value)
    (vhost,) = table.virtual_hosts
    return [r.route.cluster for r in vhost.routes], found


def test_at_gateways_a_source_labels_match_is_for_routers_with_those_labels() -> None:
    config = _config(GATEWAY_VS)
    assert [str(w) for w in config.warnings] == []
    ctx = GenContext(MeshIndex(config, []), ResourceCache())
    canary, canary_table = _gateway_routes(ctx, _router(zone="canary", pod="c"))
    plain, plain_table = _gateway_routes(ctx, _router(zone="stable"))
    assert canary == [V2, V1]
    assert plain == [V1]  # the match is dropped, not widened to every client
    assert canary_table is not plain_table


def test_routers_that_satisfy_the_same_selectors_share_one_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    translated = count_translations(monkeypatch)
    ctx = GenContext(MeshIndex(_config(GATEWAY_VS), []), ResourceCache())
    one, one_table = _gateway_routes(ctx, _router(pod="a"))
    two, two_table = _gateway_routes(ctx, _router(pod="b", zone="stable"))
    assert one == two == [V1]
    assert one_table is two_table
    assert translated == ["edge"]  # translated for the first router only


def test_a_carried_gateway_table_follows_the_selectors_not_their_positions() -> None:
    """The selectors a router satisfies, not one flag per position in the mesh's list, key
    the table carried to the next push: here a selector is replaced between two pushes so
    that the second router's flags would equal the first one's, and the second router must
    still not get the first one's canary match."""
    first = _config(GATEWAY_VS, _sidecar_only_vs("zz-other", "team: b"))
    ctx = GenContext(MeshIndex(first, []), ResourceCache())
    assert _gateway_routes(ctx, _router(zone="canary"))[0] == [V2, V1]
    second = _config(GATEWAY_VS, _sidecar_only_vs("aa-other", "team: c"))
    ctx = next_context(ctx, ctx.index.next(second, version=1))
    assert _gateway_routes(ctx, _router(team="c"))[0] == [V1]
    assert _gateway_routes(ctx, _router(zone="canary"))[0] == [V2, V1]
