"""VirtualService `directResponse` (Istio's HTTPDirectResponse): parsed from YAML and built into
an Envoy route that answers by itself, with a string body, a base64 `bytes` body, or none."""

from __future__ import annotations

import textwrap

from control.config.loader import load_text
from control.generate.route_translation import RouteSpec, build_route
from control.model.traffic import DirectResponse, HttpRoute

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
