"""VirtualService `directResponse` (Istio's HTTPDirectResponse): parsed from YAML and built into
an Envoy route that answers by itself, with a string body, a base64 `bytes` body, or none."""

from __future__ import annotations

import textwrap

from envoy.config.route.v3.route_pb2 import RouteConfiguration
from google.protobuf import any_pb2

from control.config.loader import load_text
from control.generate import ROUTER_GENERATORS
from control.generate.context import GenContext
from control.generate.resource_names import ROUTE_TYPE
from control.generate.route_translation import RouteSpec, build_route
from control.model.index import MeshIndex
from control.model.traffic import DirectResponse, HttpRoute
from control.xds.cache import ResourceCache
from tests.support.gateways import GATEWAY_MESH, router
from tests.support.traffic import mesh_config

VS = """
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: shop, namespace: default}
spec:
  hosts: [shop]
  http:
  - match: [{uri: {prefix: /down}}]
    directResponse: {status: 503, body: {string: "down for maintenance"}}
    headers: {response: {set: {x-maintenance: "yes"}}}
  - match: [{uri: {exact: /logo}}]
    directResponse: {status: 200, body: {bytes: "iVBORw0K"}}
  - match: [{uri: {exact: /gone}}]
    directResponse: {status: 410}
  - route: [{destination: {host: shop}}]
"""


def _routes() -> tuple[HttpRoute, ...]:
    config = load_text(textwrap.dedent(VS).lstrip("\n"), "t.yaml")
    assert [str(w) for w in config.warnings] == []
    (vs,) = config.objects[0].virtual_services
    return vs.http


def test_direct_responses_are_parsed_with_their_bodies() -> None:
    down, logo, gone, rest = _routes()
    assert down.direct_response == DirectResponse(503, "down for maintenance")
    assert down.destinations == ()
    assert logo.direct_response == DirectResponse(200, b"\x89PNG\r\n")
    assert gone.direct_response == DirectResponse(410)
    assert rest.direct_response is None and len(rest.destinations) == 1


def test_direct_responses_become_envoy_direct_response_routes() -> None:
    down, logo, gone, _ = _routes()
    (route,) = build_route(RouteSpec(down, down.matches, ()))
    assert route.WhichOneof("action") == "direct_response"
    assert route.match.prefix == "/down"
    assert route.direct_response.status == 503
    assert route.direct_response.body.inline_string == "down for maintenance"
    # Response header operations apply to a direct response too (Envoy adds them).
    (header,) = route.response_headers_to_add
    assert (header.header.key, header.header.value) == ("x-maintenance", "yes")
    (route,) = build_route(RouteSpec(logo, logo.matches, ()))
    assert route.direct_response.body.inline_bytes == b"\x89PNG\r\n"
    (route,) = build_route(RouteSpec(gone, gone.matches, ()))
    assert route.direct_response.status == 410 and not route.direct_response.HasField("body")


def test_a_gateway_answers_a_direct_response_too() -> None:
    vs = """
    ---
    apiVersion: networking.istio.io/v1
    kind: VirtualService
    metadata: {name: status, namespace: default}
    spec:
      hosts: [plain.example.com]
      gateways: [edge/a]
      http:
      - match: [{uri: {exact: /healthz}}]
        directResponse: {status: 200, body: {string: ok}}
    """
    config = mesh_config(GATEWAY_MESH, textwrap.dedent(vs))
    assert [str(w) for w in config.warnings] == []
    proxy = router()
    ctx = GenContext(MeshIndex(config, []), ResourceCache())
    routes = ROUTER_GENERATORS[ROUTE_TYPE](ctx, proxy)
    any_msg = any_pb2.Any()
    any_msg.ParseFromString(routes["http.80"].any_bytes)
    table = RouteConfiguration()
    assert any_msg.Unpack(table)
    (plain,) = [v for v in table.virtual_hosts if v.name == "plain.example.com:80"]
    direct = [r for r in plain.routes if r.WhichOneof("action") == "direct_response"]
    assert [(r.match.path, r.direct_response.status) for r in direct] == [("/healthz", 200)]
    assert direct[0].direct_response.body.inline_string == "ok"
