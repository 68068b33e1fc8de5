"""VirtualService `corsPolicy`: parsed from YAML, translated as Istio translates it (an Envoy
`CorsPolicy` in the route's `typed_per_filter_config`), and the CORS filter in front of the
fault filter and the router in every HTTP connection manager whose routes come from
VirtualServices: outbound in mode NONE, the virtual outbound listener in mode REDIRECT, and
gateways."""

from __future__ import annotations

import textwrap

import pytest
from envoy.extensions.filters.http.cors.v3.cors_pb2 import CorsPolicy as EnvoyCorsPolicy
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)

from control.config.errors import ConfigError
from control.config.loader import load_text
from control.generate.gateway_listeners import gateway_hcm
from control.generate.listeners_explicit import build_outbound_http
from control.generate.listeners_redirect import build_virtual_outbound
from control.generate.route_translation import CORS_FILTER, RouteSpec, build_route
from control.model.traffic import CorsPolicy, HttpRoute, MatchKind, StringMatch


def _vs(cors: str) -> str:
    return textwrap.dedent(
        f"""
        apiVersion: networking.istio.io/v1
        kind: VirtualService
        metadata: {{name: shop, namespace: default}}
        spec:
          hosts: [shop]
          http:
          - corsPolicy: {cors}
            route: [{{destination: {{host: shop}}}}]
        """
    ).lstrip("\n")


def _route(cors: str) -> HttpRoute:
    config = load_text(_vs(cors), "t.yaml")
    assert [str(w) for w in config.warnings] == []
    (vs,) = config.objects[0].virtual_services
    (route,) = vs.http
    return route


FULL = (
    "{allowOrigins: [{exact: 'https://shop.example'}, {prefix: 'https://app.'},"
    " {regex: 'https://.*[.]test'}], allowMethods: [GET, POST],"
    " allowHeaders: [x-token, content-type], exposeHeaders: [x-app], maxAge: 1h30s,"
    " allowCredentials: false, unmatchedPreflights: IGNORE}"
)


def test_a_full_policy_is_parsed() -> None:
    assert _route(FULL).cors == CorsPolicy(
        allow_origins=(
            StringMatch(MatchKind.EXACT, "https://shop.example"),
            StringMatch(MatchKind.PREFIX, "https://app."),
            StringMatch(MatchKind.REGEX, "https://.*[.]test"),
        ),
        allow_methods=("GET", "POST"),
        allow_headers=("x-token", "content-type"),
        expose_headers=("x-app",),
        max_age=3630,
        allow_credentials=False,
        forward_unmatched_preflights=False,
    )


def test_the_legacy_allow_origin_is_exact_and_preflights_are_forwarded_by_default() -> None:
    cors = _route("{allowOrigin: ['https://a.example', 'https://b.example']}").cors
    assert cors is not None
    assert cors.allow_origins == (
        StringMatch(MatchKind.EXACT, "https://a.example"),
        StringMatch(MatchKind.EXACT, "https://b.example"),
    )
    assert cors.forward_unmatched_preflights and cors.allow_credentials is None


@pytest.mark.parametrize(
    ("cors", "message"),
    [
        (
            "{allowOrigin: [a], allowOrigins: [{exact: b}]}",
            "corsPolicy.allowOrigin: cannot be combined with allowOrigins",
        ),
        ("{allowCredentials: 'yes'}", "corsPolicy.allowCredentials: must be true or false"),
        ("{unmatchedPreflights: DROP}", "corsPolicy.unmatchedPreflights: must be one of"),
        ("{allowOrigins: [{regex: '('}]}", "invalid regular expression"),
    ],
)
def test_policy_errors(cors: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(_vs(cors), "t.yaml")
    assert message in str(info.value)


def test_the_route_carries_envoys_cors_policy() -> None:
    route = _route(FULL)
    (built,) = build_route(RouteSpec(route, route.matches, ()))
    policy = EnvoyCorsPolicy()
    assert built.typed_per_filter_config[CORS_FILTER].Unpack(policy)
    origins = policy.allow_origin_string_match
    assert (origins[0].exact, origins[1].prefix) == ("https://shop.example", "https://app.")
    assert origins[2].safe_regex.regex == "https://.*[.]test"
    assert (policy.allow_methods, policy.allow_headers, policy.expose_headers) == (
        "GET,POST",
        "x-token,content-type",
        "x-app",
    )
    assert policy.max_age == "3630"
    assert policy.HasField("allow_credentials") and not policy.allow_credentials.value
    assert not policy.forward_not_matching_preflights.value
    # Without corsPolicy, nothing for the filter.
    (plain,) = build_route(RouteSpec(HttpRoute(), (), ()))
    assert CORS_FILTER not in plain.typed_per_filter_config


def _filters(hcm: HttpConnectionManager) -> list[str]:
    return [f.name for f in hcm.http_filters]


def _hcm_of(chain: object) -> HttpConnectionManager:
    hcm = HttpConnectionManager()
    assert chain.filters[0].typed_config.Unpack(hcm)  # type: ignore[attr-defined]
    return hcm


ROUTE_FILTERS = ["envoy.filters.http.cors", "envoy.filters.http.fault", "envoy.filters.http.router"]


def test_every_virtualservice_hcm_has_cors_then_fault_before_the_router() -> None:
    explicit = build_outbound_http("127.0.1.1", 9080)
    assert _filters(_hcm_of(explicit.filter_chains[0])) == ROUTE_FILTERS
    # Mode REDIRECT: the virtual outbound listener's HTTP chains (fault injection was missing
    # there before: the per-route fault config had no filter to apply it).
    virtual = build_virtual_outbound((("http", 9080, (), (), ((), False)),), "ALLOW_ANY")
    assert _filters(_hcm_of(virtual.filter_chains[0])) == ROUTE_FILTERS
    assert _filters(gateway_hcm("gateway_0.0.0.0_80", "http.80")) == ROUTE_FILTERS
