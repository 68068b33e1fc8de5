"""VirtualService and DestinationRule kinds: conversion, short names, errors with file:line,
unsupported fields reported, and conflict warnings that name both objects."""

from __future__ import annotations

import textwrap

import pytest

from control.config.errors import ConfigError
from control.config.loader import load_text
from control.config.merge import merge
from control.generate.route_translation import RouteSpec, build_route
from control.model.traffic import (
    ClientTls,
    ConsistentHash,
    Destination,
    HeaderMatch,
    LbPolicy,
    MatchKind,
    StringMatch,
    TlsMode,
    TrafficPolicy,
    bound_to,
)
from tests.support.traffic import TRAFFIC_YAML, traffic_config


def load(text: str) -> object:
    return load_text(textwrap.dedent(text).lstrip("\n"), "t.yaml")


def test_everything_supported_converts_without_warnings() -> None:
    config = traffic_config()
    assert [str(w) for w in config.warnings] == []
    rules = {r.name: r for r in config.destination_rules}
    reviews = rules["reviews"]
    assert reviews.host == "reviews.default.svc.cluster.local"
    assert [s.name for s in reviews.subsets] == ["v1", "v2"]
    # Port-level settings override the top level; the subset overrides both.
    assert reviews.effective_policy(9080).load_balancer.simple is LbPolicy.RANDOM  # type: ignore[union-attr]
    assert reviews.effective_policy(9999).load_balancer.simple is LbPolicy.LEAST_REQUEST  # type: ignore[union-attr]
    v2 = reviews.effective_policy(9080, "v2")
    assert v2.load_balancer.consistent_hash == ConsistentHash(header="x-user")  # type: ignore[union-attr]
    assert v2.connection_pool is not None and v2.connection_pool.max_connections == 100
    assert v2.connection_pool.connect_timeout == 0.25
    assert v2.outlier_detection is not None and v2.outlier_detection.base_ejection_time == 30
    assert rules["ratings"].effective_policy(9080, "canary").tls == ClientTls(TlsMode.DISABLE)
    assert rules["mirror"].policy == TrafficPolicy(
        tls=ClientTls(TlsMode.SIMPLE, subject_alt_names=("mirror.example",), sni="mirror.example")
    )
    vs = {v.name: v for v in config.virtual_services}
    marked = vs["reviews"].http[0]
    assert marked.matches[0].headers == (
        HeaderMatch("end-user", StringMatch(MatchKind.EXACT, "jason")),
    )
    assert marked.matches[1].headers == (HeaderMatch("x-skip", None, invert=True),)
    assert marked.matches[2].port == 9080
    split = vs["reviews"].http[-1]
    assert [d.weight for d in split.destinations] == [90, 10]
    assert split.mirror == Destination("ratings.default.svc.cluster.local")
    assert split.mirror_percent == 25.0
    assert vs["reviews"].http[1].retries.per_try_timeout == 0.5  # type: ignore[union-attr]
    assert vs["reviews"].http[4].fault.abort_percent == 50.5  # type: ignore[union-attr]
    assert [d.subset for d in vs["db"].tcp[0].destinations] == ["primary", "replica"]


@pytest.mark.parametrize(
    ("spec", "line", "message"),
    [
        (
            "host: reviews\n  trafficPolicy:\n    loadBalancer: {simple: FASTEST}",
            7,
            "spec.trafficPolicy.loadBalancer.simple: must be one of",
        ),
        (
            "host: reviews\n  subsets:\n  - {name: v1, labels: {version: v1}}\n"
            "  - {name: v1, labels: {version: v2}}",
            8,
            "duplicate subset 'v1'",
        ),
        (
            "host: reviews\n  trafficPolicy:\n    outlierDetection: {interval: soon}",
            7,
            "must be a duration",
        ),
        (
            "host: reviews\n  trafficPolicy:\n    loadBalancer:\n      consistentHash: {}",
            8,
            "set exactly one of",
        ),
        ("host: reviews\n  trafficPolicy:\n    tls: {mode: MUTUAL}", 7, "MUTUAL needs"),
        ("host: 'bad host'", 5, "spec.host: must be a DNS name"),
    ],
)
def test_destination_rule_errors(spec: str, line: int, message: str) -> None:
    text = (
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\n"
        f"metadata: {{name: r}}\nspec:\n  {spec}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_text(text, "t.yaml")
    assert message in str(info.value)
    assert str(info.value).startswith(f"t.yaml:{line}: DestinationRule default/r: ")


@pytest.mark.parametrize(
    ("http", "message"),
    [
        ("- route: [{destination: {host: a}}, {destination: {host: b}}]", "weights are required"),
        (
            "- match: [{uri: {exact: /a, prefix: /b}}]\n    route: [{destination: {host: a}}]",
            "exactly one of exact, prefix, regex",
        ),
        (
            "- match: [{uri: {regex: '('}}]\n    route: [{destination: {host: a}}]",
            "invalid regular expression",
        ),
        ("- redirect: {uri: /x}\n    route: [{destination: {host: a}}]", "cannot be combined"),
        ("- timeout: 1s", "route: is required"),
        (
            "- fault: {abort: {grpcStatus: UNAVAILABLE}}\n    route: [{destination: {host: a}}]",
            "httpStatus: is required",
        ),
        ("- route: [{destination: {host: '*.example.com'}}]", "not a wildcard"),
        (
            "- directResponse: {status: 503}\n    route: [{destination: {host: a}}]",
            "directResponse: cannot be combined with route",
        ),
        (
            "- directResponse: {status: 503}\n    redirect: {uri: /x}",
            "redirect: cannot be combined with directResponse",
        ),
        (
            "- redirect: {uri: /x}\n    rewrite: {uri: /y}",
            "redirect: cannot be combined with rewrite",
        ),
        (
            "- directResponse: {status: 503}\n    fault: {abort: {httpStatus: 500}}",
            "directResponse: cannot be combined with fault",
        ),
        ("- directResponse: {body: {string: x}}", "directResponse.status: is required"),
        ("- directResponse: {status: 99}", "directResponse.status: must be an integer 200-599"),
        (
            "- directResponse: {status: 200, body: {string: a, bytes: YQ==}}",
            "directResponse.body: takes one of string or bytes",
        ),
        ("- directResponse: {status: 200, body: {bytes: '%%%'}}", "body.bytes: is not base64"),
    ],
)
def test_virtual_service_errors(http: str, message: str) -> None:
    text = (
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: v}\n"
        f"spec:\n  hosts: [a]\n  http:\n  {http}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_text(text, "t.yaml")
    assert message in str(info.value)
    assert str(info.value).startswith("t.yaml:")


def test_unsupported_parts_are_reported_and_fail_narrow() -> None:
    fc = load(
        """
        apiVersion: networking.istio.io/v1
        kind: VirtualService
        metadata: {name: v, namespace: shop}
        spec:
          hosts: [web, api.example.com]
          gateways: [mesh, istio-system/public]
          http:
          - match: [{port: 9080, scheme: {exact: https}, foo: bar}]
            route: [{destination: {host: web}}]
          - match: [{foo: bar}, {uri: {prefix: /ok}}]
            websocketUpgrade: true
            route: [{destination: {host: web}}]
        ---
        apiVersion: networking.istio.io/v1
        kind: VirtualService
        metadata: {name: gw, namespace: shop}
        spec:
          hosts: [web]
          gateways: [public]
          http: [{route: [{destination: {host: web}}]}]
        """
    )
    objects = fc.objects  # type: ignore[attr-defined]
    vs = objects[0].virtual_services[0]
    assert vs.hosts == ("web.shop.svc.cluster.local", "api.example.com")
    # The route whose only match cannot be honoured is dropped (matches less, never more);
    # the other keeps its usable match only.
    assert len(vs.http) == 1 and vs.http[0].matches[0].uri.value == "/ok"
    assert vs.gateways == ("mesh", "istio-system/public")
    # Gateways only (a bare name is in the VirtualService's namespace): not for sidecars.
    (gw,) = objects[1].virtual_services
    assert gw.gateways == ("shop/public",)
    assert bound_to(gw, "mesh") is None and bound_to(gw, "shop/public") is gw
    text = "\n".join(w.message for w in fc.warnings)  # type: ignore[attr-defined]
    assert "spec.http[0].match[0].foo is not supported; this match is dropped" in text
    assert "spec.http[0]: no match condition is usable; route ignored" in text
    assert "spec.http[1].websocketUpgrade is not supported; ignored" in text


def test_conflicts_name_both_objects_and_the_outcome() -> None:
    config = merge(
        [
            load_text(TRAFFIC_YAML, "a.yaml"),
            load_text(
                textwrap.dedent(
                    """
                    apiVersion: networking.istio.io/v1
                    kind: VirtualService
                    metadata: {name: zz-reviews, namespace: default}
                    spec:
                      hosts: [reviews.default.svc.cluster.local]
                      http: [{route: [{destination: {host: reviews, subset: v3}}]}]
                    ---
                    apiVersion: networking.istio.io/v1
                    kind: DestinationRule
                    metadata: {name: zz-reviews, namespace: default}
                    spec: {host: reviews}
                    ---
                    apiVersion: networking.istio.io/v1
                    kind: VirtualService
                    metadata: {name: nothing, namespace: default}
                    spec:
                      hosts: [nothing]
                      http: [{route: [{destination: {host: nothing, subset: v1}}]}]
                    """
                ),
                "b.yaml",
            ),
        ]
    )
    warnings = [str(w) for w in config.warnings]
    assert (
        "VirtualService default/zz-reviews (b.yaml:2): host reviews.default.svc.cluster.local "
        "is also routed by VirtualService default/reviews (a.yaml:79); only one VirtualService "
        "routes a host: default/reviews (first by namespace/name) is used for it, this one is "
        "ignored for that host"
    ) in warnings
    assert (
        "DestinationRule default/zz-reviews (b.yaml:9): host reviews.default.svc.cluster.local "
        "already has DestinationRule default/reviews (a.yaml:2) in namespace default; "
        "default/reviews (first by name) is used, this one is ignored"
    ) in warnings
    assert (
        "VirtualService default/zz-reviews (b.yaml:2): route to reviews.default.svc.cluster."
        "local subset 'v3': DestinationRule default/reviews (a.yaml:2) does not define it; "
        "requests routed there get 503 (no such cluster)"
    ) in warnings
    assert any(
        "subset 'v1': no DestinationRule for host nothing.default.svc.cluster.local" in w
        for w in warnings
    )


def test_stat_prefix_names_the_routes_statistics() -> None:
    fc = load(
        """
        apiVersion: networking.istio.io/v1
        kind: VirtualService
        metadata: {name: v, namespace: shop}
        spec:
          hosts: [web]
          http:
          - match: [{uri: {prefix: /api}, statPrefix: web-api}, {uri: {prefix: /v2}}]
            route: [{destination: {host: web}}]
        """
    )
    assert not fc.warnings  # type: ignore[attr-defined]
    (route,) = fc.objects[0].virtual_services[0].http  # type: ignore[attr-defined]
    api, v2 = build_route(RouteSpec(route, route.matches, ()))
    assert (api.match.prefix, api.stat_prefix) == ("/api", "web-api")
    assert (v2.match.prefix, v2.stat_prefix) == ("/v2", "")  # per match, as Istio
