"""VirtualService `directResponse` (Istio's HTTPDirectResponse): parsed from YAML and built into
an Envoy route that answers by itself, with a string body, a base64 `bytes` body, or none."""

from __future__ import annotations

import base64
import textwrap
from collections.abc import Callable
from typing import TypeVar

import pytest
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)
from google.protobuf import any_pb2
from google.protobuf.message import Message

from control.config.errors import ConfigError
from control.config.loader import load_text
from control.generate import ROUTER_GENERATORS, generators_for
from control.generate.context import GenContext
from control.generate.filters import edit_proxies
from control.generate.resource_names import LISTENER_TYPE, ROUTE_TYPE
from control.generate.route_translation import RouteSpec, build_route
from control.model.index import MeshIndex
from control.model.proxy import Proxy, proxy_from_node
from control.model.traffic import DirectResponse, HttpRoute
from control.model.types import MeshConfig
from control.xds.cache import ResourceCache, ResourceSet
from tests.support.gateways import GATEWAY_MESH, router
from tests.support.traffic import mesh_config
from tests.unit.test_generate_grpc import grpc_client, grpc_mesh
from tests.unit.test_generate_sidecar import mesh as sidecar_mesh

M = TypeVar("M", bound=Message)
# Istio's limit on a direct response's body, which Envoy is told on every route table.
MEBIBYTE = 1 << 20

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


def _body_vs(body: str) -> str:
    return textwrap.dedent(
        f"""
        apiVersion: networking.istio.io/v1
        kind: VirtualService
        metadata: {{name: shop, namespace: default}}
        spec:
          hosts: [shop]
          http:
          - directResponse: {{status: 200, body: {body}}}
        """
    ).lstrip("\n")


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda n: "{string: " + "x" * n + "}", id="string"),
        # Two bytes of UTF-8 per character: the limit counts bytes, not characters.
        pytest.param(lambda n: "{string: " + "é" * (n // 2) + "x" * (n % 2) + "}", id="utf-8"),
        pytest.param(
            lambda n: "{bytes: " + base64.b64encode(b"\xff" * n).decode() + "}", id="bytes"
        ),
    ],
)
def test_a_body_of_up_to_one_mebibyte_is_taken(make: Callable[[int], str]) -> None:
    (vs,) = load_text(_body_vs(make(MEBIBYTE)), "t.yaml").objects[0].virtual_services
    direct = vs.http[0].direct_response
    assert direct is not None and direct.body is not None
    body = direct.body.encode() if isinstance(direct.body, str) else direct.body
    assert len(body) == MEBIBYTE
    with pytest.raises(ConfigError) as info:
        load_text(_body_vs(make(MEBIBYTE + 1)), "t.yaml")
    assert str(info.value).startswith("t.yaml:")
    assert "directResponse.body: is 1048577 bytes; the limit is 1048576" in str(info.value)


def _route_configs(sets: dict[str, ResourceSet]) -> dict[str, list[RouteConfiguration]]:
    """Every RouteConfiguration a proxy is sent: its RDS tables, and those inline in its
    listeners' HTTP connection managers."""
    out: dict[str, list[RouteConfiguration]] = {"rds": [], "inline": []}
    for resource in sets.get(ROUTE_TYPE, {}).values():
        out["rds"].append(_unpacked(resource.any_bytes, RouteConfiguration()))

    def inline(hcm: HttpConnectionManager) -> None:
        if hcm.HasField("route_config"):
            out["inline"].append(hcm.route_config)

    for resource in sets.get(LISTENER_TYPE, {}).values():
        edit_proxies(_unpacked(resource.any_bytes, Listener()), hcm=inline)
    return out


def _unpacked(data: bytes, msg: M) -> M:
    any_msg = any_pb2.Any()
    any_msg.ParseFromString(data)
    assert any_msg.Unpack(msg)
    return msg


def _sidecar(mode: str) -> Proxy:
    return proxy_from_node(
        "sidecar~127.0.1.1~client.default~default.svc.cluster.local",
        {"LABELS": {"app": "client"}, "INTERCEPTION_MODE": mode},
    )


@pytest.mark.parametrize(
    ("config", "proxy", "kinds"),
    [
        pytest.param(sidecar_mesh, lambda: _sidecar("NONE"), {"rds", "inline"}, id="sidecar"),
        pytest.param(sidecar_mesh, lambda: _sidecar("REDIRECT"), {"rds", "inline"}, id="redirect"),
        pytest.param(lambda: mesh_config(GATEWAY_MESH), router, {"rds"}, id="router"),
        pytest.param(grpc_mesh, grpc_client, {"rds"}, id="grpc"),
    ],
)
def test_every_route_configuration_raises_envoys_body_limit(
    config: Callable[[], MeshConfig], proxy: Callable[[], Proxy], kinds: set[str]
) -> None:
    p = proxy()
    ctx = GenContext(MeshIndex(config(), [p.as_workload()]), ResourceCache())
    found = _route_configs({t: gen(ctx, p) for t, gen in generators_for(p).items()})
    assert {kind for kind, configs in found.items() if configs} >= kinds
    limits = {rc.max_direct_response_body_size_bytes.value for c in found.values() for rc in c}
    assert limits == {MEBIBYTE}
