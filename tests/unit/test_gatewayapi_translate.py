"""Gateway API -> model Gateways and VirtualServices, and the status computed on the way."""

from __future__ import annotations

import re

import pytest

from control.gatewayapi.hostnames import intersect, route_hosts
from control.generate import generators_for
from control.generate.context import GenContext
from control.generate.resource_names import LISTENER_TYPE
from control.model.gateway import ServerTlsMode
from control.model.gatewayapi import (
    GATEWAY_NAME_LABEL,
    GROUP,
    GrantFrom,
    GrantTo,
    ReferenceGrant,
    reference_granted,
)
from control.model.index import MeshIndex
from control.model.proxy import proxy_from_node
from control.model.traffic import MatchKind, VirtualService
from control.model.traffic_index import TrafficIndex
from control.model.types import MeshConfig, Protocol, SourceRef
from control.xds.cache import ResourceCache
from tests.support.gatewayapi import (
    backend,
    conditions,
    gateway,
    gateway_class,
    listener,
    load,
    reference_grant,
    route,
    service,
    status_of,
)
from tests.support.secrets import any_tls_secret

BASE = (gateway_class(), service("v1"), service("v2"))


def only_vs(mesh: MeshConfig) -> VirtualService:
    assert len(mesh.virtual_services) == 1, mesh.virtual_services
    return mesh.virtual_services[0]


# --- gateways --------------------------------------------------------------------------------


def test_gateway_becomes_a_model_gateway_selecting_its_routers() -> None:
    mesh = load(
        *BASE,
        gateway(
            listeners=[
                listener("http", 8080, hostname="*.example.com"),
                listener(
                    "https",
                    8443,
                    "HTTPS",
                    tls={"certificateRefs": [{"name": "cert"}]},
                ),
                listener(
                    "shared",
                    8443,
                    "HTTPS",
                    hostname="shared.example.com",
                    tls={"certificateRefs": [{"name": "cert", "namespace": "certs"}]},
                ),
                listener("tls", 9443, "TLS", tls={"mode": "Passthrough"}),
                listener("tcp", 9000, "TCP"),
            ]
        ),
        reference_grant("gw-certs", "certs", "infra", from_kind="Gateway", to_kind="Secret"),
        # certificateRefs resolve only to Secrets that exist.
        any_tls_secret("cert", "infra"),
        any_tls_secret("cert", "certs"),
    )
    (gw,) = mesh.gateways
    assert (gw.namespace, gw.name) == ("infra", "gw")
    assert gw.selector == ((GATEWAY_NAME_LABEL, "gw"),)
    by_name = {s.name: s for s in gw.servers}
    assert by_name["http"].hosts == ("*/*.example.com",)
    assert by_name["http"].protocol is Protocol.HTTP and by_name["http"].tls is None
    https = by_name["https"]
    assert https.protocol is Protocol.HTTPS and https.hosts == ("*/*",)
    assert https.tls is not None and https.tls.mode is ServerTlsMode.SIMPLE
    assert https.tls.credential_name == "cert"
    shared = by_name["shared"].tls
    assert shared is not None and shared.credential_name == "certs/cert"
    passthrough = by_name["tls"].tls
    assert passthrough is not None and passthrough.mode is ServerTlsMode.PASSTHROUGH
    assert by_name["tcp"].protocol is Protocol.TCP
    assert conditions(mesh, "Gateway", "infra", "gw") == {
        "Accepted": "True/Accepted",
        "Programmed": "True/Programmed",
    }


def test_gateways_of_other_controllers_are_left_alone() -> None:
    mesh = load(
        gateway_class("other", "example.com/else"),
        gateway(class_name="other"),
        gateway("nogc", class_name="missing"),
        route("r", rules=[{"backendRefs": [backend("v1")]}]),
        service("v1"),
    )
    assert mesh.gateways == ()
    assert mesh.virtual_services == ()
    assert mesh.gateway_api_status == ()  # nothing of ours to report on


def test_istio_controller_name_is_ours_too() -> None:
    mesh = load(gateway_class("istio", "istio.io/gateway-controller"), gateway(class_name="istio"))
    assert len(mesh.gateways) == 1
    assert conditions(mesh, "GatewayClass", "", "istio") == {"Accepted": "True/Accepted"}


def test_invalid_listeners_are_reported_and_the_others_served() -> None:
    mesh = load(
        *BASE,
        gateway(
            listeners=[
                listener("ok", 8080),
                listener("udp", 8081, "UDP"),
                listener("nocert", 8443, "HTTPS", tls={}),
                listener(
                    "foreign",
                    8444,
                    "HTTPS",
                    tls={"certificateRefs": [{"name": "c", "namespace": "elsewhere"}]},
                ),
                listener("missing", 8445, "HTTPS", tls={"certificateRefs": [{"name": "gone"}]}),
                listener("clash", 8080, "TCP"),
                listener("twin", 8080),
            ]
        ),
        secrets={("infra", "present"), ("elsewhere", "c")},
    )
    (gw,) = mesh.gateways
    assert [s.name for s in gw.servers] == ["ok"]
    listeners = {ls.name: ls for ls in status_of(mesh, "Gateway", "infra", "gw").listeners}

    def reasons(name: str) -> dict[str, str]:
        return {c.type: f"{c.status}/{c.reason}" for c in listeners[name].conditions}

    assert reasons("ok")["Programmed"] == "True/Programmed"
    assert reasons("udp")["Accepted"] == "False/UnsupportedProtocol"
    assert reasons("nocert")["Accepted"] == "False/UnsupportedValue"
    assert reasons("foreign")["ResolvedRefs"] == "False/RefNotPermitted"
    assert reasons("missing")["ResolvedRefs"] == "False/InvalidCertificateRef"
    assert reasons("clash")["Conflicted"] == "True/ProtocolConflict"
    assert reasons("twin")["Conflicted"] == "True/HostnameConflict"
    for name in ("udp", "nocert", "foreign", "missing", "clash", "twin"):
        assert reasons(name)["Programmed"] == "False/Invalid"
    assert conditions(mesh, "Gateway", "infra", "gw")["Accepted"] == "True/ListenersNotValid"


# --- HTTP routes -----------------------------------------------------------------------------


def test_weighted_backends_become_weighted_destinations() -> None:
    mesh = load(
        *BASE,
        gateway(),
        route(
            "split",
            hostnames=["split.example.com"],
            rules=[{"backendRefs": [backend("v1", weight=90), backend("v2", weight=10)]}],
        ),
    )
    vs = only_vs(mesh)
    assert vs.namespace == "infra" and vs.gateways == ("infra/gw",)
    assert vs.hosts == ("split.example.com",)
    (r,) = vs.http
    assert [(d.host, d.port, d.weight) for d in r.destinations] == [
        ("v1.infra.svc.cluster.local", 8080, 90),
        ("v2.infra.svc.cluster.local", 8080, 10),
    ]
    (m,) = r.matches
    assert m.port == 8080 and m.uri is not None and m.uri.value == "/"
    assert conditions(mesh, "HTTPRoute", "infra", "split") == {
        "Accepted": "True/Accepted",
        "ResolvedRefs": "True/ResolvedRefs",
    }
    listeners = status_of(mesh, "Gateway", "infra", "gw").listeners
    assert listeners[0].attached_routes == 1


def test_a_zero_weight_backend_gets_no_traffic() -> None:
    mesh = load(
        *BASE,
        gateway(),
        route("r", rules=[{"backendRefs": [backend("v1", weight=1), backend("v2", weight=0)]}]),
    )
    (r,) = only_vs(mesh).http
    assert [d.host for d in r.destinations] == ["v1.infra.svc.cluster.local"]


def test_path_prefix_matches_whole_path_elements() -> None:
    mesh = load(
        *BASE,
        gateway(),
        route(
            "r",
            rules=[
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/api/"}}],
                    "backendRefs": [backend("v1")],
                }
            ],
        ),
    )
    (r,) = only_vs(mesh).http
    uri = r.matches[0].uri
    assert uri is not None and uri.kind is MatchKind.REGEX
    assert re.fullmatch(uri.value, "/api")
    assert re.fullmatch(uri.value, "/api/v1/x")
    assert not re.fullmatch(uri.value, "/apiv1")


def test_matches_are_ordered_by_gateway_api_precedence_across_routes() -> None:
    mesh = load(
        *BASE,
        gateway(),
        route(
            "a",
            rules=[
                {"backendRefs": [backend("v1")]},  # PathPrefix /
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/api"}}],
                    "backendRefs": [backend("v1")],
                },
            ],
        ),
        route(
            "b",
            rules=[
                {
                    "matches": [
                        {"path": {"type": "Exact", "value": "/x"}},
                        {"path": {"type": "PathPrefix", "value": "/api/long"}},
                        {
                            "path": {"type": "PathPrefix", "value": "/api"},
                            "headers": [{"name": "X-Canary", "value": "yes"}],
                        },
                        {"path": {"type": "PathPrefix", "value": "/api"}, "method": "POST"},
                        {"path": {"type": "RegularExpression", "value": "/r/[0-9]+"}},
                    ],
                    "backendRefs": [backend("v2")],
                }
            ],
        ),
    )
    vs = only_vs(mesh)
    names = [r.name for r in vs.http]
    assert names == [
        "infra.b.0.0",  # Exact
        "infra.b.0.4",  # RegularExpression
        "infra.b.0.1",  # the longest prefix
        "infra.b.0.3",  # /api with a method
        "infra.b.0.2",  # /api with a header
        "infra.a.1.0",  # /api, nothing else: same prefix, fewer conditions
        "infra.a.0.0",  # the catch-all
    ]
    header = vs.http[4].matches[0].headers[0]
    assert header.name == "x-canary" and header.match is not None
    assert header.match.value == "yes"
    method = vs.http[3].matches[0].method
    assert method is not None and method.value == "POST"


def test_query_and_regex_header_matches() -> None:
    mesh = load(
        *BASE,
        gateway(),
        route(
            "r",
            rules=[
                {
                    "matches": [
                        {
                            "queryParams": [{"name": "v", "value": "2"}],
                            "headers": [
                                {"type": "RegularExpression", "name": "x-id", "value": "[0-9]+"}
                            ],
                        }
                    ],
                    "backendRefs": [backend("v2")],
                }
            ],
        ),
    )
    (m,) = only_vs(mesh).http[0].matches
    assert m.query_params[0][0] == "v" and m.query_params[0][1].kind is MatchKind.EXACT
    assert m.headers[0].match is not None and m.headers[0].match.kind is MatchKind.REGEX


def test_filters_become_model_operations() -> None:
    mesh = load(
        *BASE,
        gateway(),
        route(
            "r",
            rules=[
                {
                    "matches": [{"path": {"value": "/old"}}],
                    "filters": [
                        {
                            "type": "RequestHeaderModifier",
                            "requestHeaderModifier": {
                                "set": [{"name": "X-Set", "value": "1"}],
                                "add": [{"name": "X-Add", "value": "2"}],
                                "remove": ["X-Gone"],
                            },
                        },
                        {
                            "type": "ResponseHeaderModifier",
                            "responseHeaderModifier": {"set": [{"name": "X-Resp", "value": "r"}]},
                        },
                        {
                            "type": "URLRewrite",
                            "urlRewrite": {
                                "hostname": "new.example.com",
                                "path": {
                                    "type": "ReplacePrefixMatch",
                                    "replacePrefixMatch": "/new",
                                },
                            },
                        },
                        {
                            "type": "RequestMirror",
                            "requestMirror": {"backendRef": backend("v2"), "percent": 25},
                        },
                    ],
                    "backendRefs": [backend("v1")],
                },
                {
                    "matches": [{"path": {"type": "Exact", "value": "/moved"}}],
                    "filters": [
                        {
                            "type": "RequestRedirect",
                            "requestRedirect": {
                                "scheme": "https",
                                "hostname": "elsewhere.example.com",
                                "statusCode": 301,
                                "path": {"type": "ReplaceFullPath", "replaceFullPath": "/here"},
                            },
                        }
                    ],
                },
            ],
        ),
    )
    vs = only_vs(mesh)
    moved, old = vs.http  # Exact first
    assert old.headers.request_set == (("x-set", "1"),)
    assert old.headers.request_add == (("x-add", "2"),)
    assert old.headers.request_remove == ("x-gone",)
    assert old.headers.response_set == (("x-resp", "r"),)
    assert old.rewrite is not None and old.rewrite.authority == "new.example.com"
    assert old.rewrite.uri_regex is not None
    pattern, substitution = old.rewrite.uri_regex
    assert re.sub(pattern, substitution, "/old/x", count=1) == "/new/x"
    assert re.sub(pattern, substitution, "/old", count=1) == "/new"
    assert old.mirror is not None and old.mirror.host == "v2.infra.svc.cluster.local"
    assert old.mirror_percent == 25.0
    assert moved.redirect is not None
    assert (moved.redirect.scheme, moved.redirect.authority, moved.redirect.code) == (
        "https",
        "elsewhere.example.com",
        301,
    )
    assert moved.redirect.uri == "/here" and moved.destinations == ()


@pytest.mark.parametrize(
    ("prefix", "replacement", "path", "want"),
    [
        ("/api", "/", "/api/x", "/x"),
        ("/api", "/", "/api", "/"),
        ("/", "/v2", "/x", "/v2/x"),
        ("/api/", "/v2/", "/api/x", "/v2/x"),
    ],
)
def test_replace_prefix_match(prefix: str, replacement: str, path: str, want: str) -> None:
    mesh = load(
        *BASE,
        gateway(),
        route(
            "r",
            rules=[
                {
                    "matches": [{"path": {"value": prefix}}],
                    "filters": [
                        {
                            "type": "URLRewrite",
                            "urlRewrite": {
                                "path": {
                                    "type": "ReplacePrefixMatch",
                                    "replacePrefixMatch": replacement,
                                }
                            },
                        }
                    ],
                    "backendRefs": [backend("v1")],
                }
            ],
        ),
    )
    rewrite = only_vs(mesh).http[0].rewrite
    assert rewrite is not None and rewrite.uri_regex is not None
    assert re.sub(rewrite.uri_regex[0], rewrite.uri_regex[1], path, count=1) == want


def test_grpc_route_methods_become_http2_paths() -> None:
    mesh = load(
        *BASE,
        gateway(),
        route(
            "g",
            kind="GRPCRoute",
            rules=[
                {
                    "matches": [
                        {"method": {"service": "echo.Echo", "method": "Say"}},
                        {"method": {"service": "echo.Echo"}},
                    ],
                    "backendRefs": [backend("v1")],
                }
            ],
        ),
    )
    exact, service_only = only_vs(mesh).http
    assert exact.matches[0].uri is not None
    assert exact.matches[0].uri.kind is MatchKind.EXACT
    assert exact.matches[0].uri.value == "/echo.Echo/Say"
    uri = service_only.matches[0].uri
    assert uri is not None and uri.kind is MatchKind.REGEX
    assert re.fullmatch(uri.value, "/echo.Echo/Other")
    assert not re.fullmatch(uri.value, "/echoxEcho/Other")
    assert conditions(mesh, "GRPCRoute", "infra", "g")["Accepted"] == "True/Accepted"


# --- attachment ------------------------------------------------------------------------------


def test_route_from_another_namespace_needs_allowed_routes() -> None:
    objects = (*BASE, route("r", "apps", parents=[{"name": "gw", "namespace": "infra"}]))
    refused = load(*objects, gateway())
    assert conditions(refused, "HTTPRoute", "apps", "r")["Accepted"] == (
        "False/NotAllowedByListeners"
    )
    assert refused.virtual_services == ()
    assert status_of(refused, "Gateway", "infra", "gw").listeners[0].attached_routes == 0
    allowed = load(*objects, gateway(listeners=[listener(from_="All")]))
    assert conditions(allowed, "HTTPRoute", "apps", "r")["Accepted"] == "True/Accepted"


def test_allowed_routes_selector_uses_namespace_labels() -> None:
    objects = (
        *BASE,
        gateway(listeners=[listener(from_="Selector", selector={"matchLabels": {"team": "a"}})]),
        route("r", "apps", parents=[{"name": "gw", "namespace": "infra"}]),
    )
    labels = {"apps": (("team", "a"),)}
    ok = load(*objects, namespace_labels=lambda ns: labels.get(ns, ()))
    assert conditions(ok, "HTTPRoute", "apps", "r")["Accepted"] == "True/Accepted"
    refused = load(*objects)
    assert conditions(refused, "HTTPRoute", "apps", "r")["Accepted"] == (
        "False/NotAllowedByListeners"
    )


def test_selector_by_namespace_name_works_in_files() -> None:
    selector = {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["apps"]}
        ]
    }
    mesh = load(
        *BASE,
        gateway(listeners=[listener(from_="Selector", selector=selector)]),
        route("r", "apps", parents=[{"name": "gw", "namespace": "infra"}]),
        route("s", "other", parents=[{"name": "gw", "namespace": "infra"}]),
    )
    assert conditions(mesh, "HTTPRoute", "apps", "r")["Accepted"] == "True/Accepted"
    assert conditions(mesh, "HTTPRoute", "other", "s")["Accepted"] == (
        "False/NotAllowedByListeners"
    )


def test_cross_namespace_backend_needs_a_reference_grant() -> None:
    objects = (
        *BASE,
        gateway(listeners=[listener(from_="All")]),
        route(
            "r",
            "apps",
            parents=[{"name": "gw", "namespace": "infra"}],
            rules=[{"backendRefs": [backend("v1", namespace="infra")]}],
        ),
    )
    refused = load(*objects)
    assert conditions(refused, "HTTPRoute", "apps", "r") == {
        "Accepted": "True/Accepted",
        "ResolvedRefs": "False/RefNotPermitted",
    }
    # Accepted, but nothing it may reach: its requests get the spec's 500.
    (r,) = only_vs(refused).http
    assert r.fault is not None and r.fault.abort_status == 500
    assert r.fault.abort_percent == 100.0
    assert [d.host for d in r.destinations] == ["v1.infra.invalid"]
    granted = load(*objects, reference_grant("apps-in", "infra", "apps"))
    assert conditions(granted, "HTTPRoute", "apps", "r")["ResolvedRefs"] == "True/ResolvedRefs"
    (r,) = only_vs(granted).http
    assert r.destinations[0].host == "v1.infra.svc.cluster.local"
    # A grant for another name, kind or namespace does not help.
    for grant in (
        reference_grant("g", "infra", "apps", to_name="v2"),
        reference_grant("g", "infra", "elsewhere"),
        reference_grant("g", "infra", "apps", from_kind="GRPCRoute"),
        reference_grant("g", "apps", "apps"),
    ):
        still = load(*objects, grant)
        assert conditions(still, "HTTPRoute", "apps", "r")["ResolvedRefs"] == (
            "False/RefNotPermitted"
        )


def test_backend_problems_are_reported_and_answered_with_errors() -> None:
    mesh = load(
        *BASE,
        gateway(),
        route(
            "r",
            rules=[
                {"backendRefs": [backend("v1"), backend("nope")]},
                {
                    "matches": [{"path": {"value": "/p"}}],
                    "backendRefs": [backend("v1", port=9999)],
                },
                {
                    "matches": [{"path": {"value": "/k"}}],
                    "backendRefs": [{"kind": "ConfigMap", "group": "", "name": "x"}],
                },
            ],
        ),
    )
    assert conditions(mesh, "HTTPRoute", "infra", "r")["ResolvedRefs"] == ("False/BackendNotFound")
    by_path = {r.matches[0].uri.value if r.matches[0].uri else "": r for r in only_vs(mesh).http}
    # A missing backend keeps its share of the split, sent to no cluster (an error), rather
    # than the valid backend taking it over.
    split = by_path["/"]
    assert split.fault is None
    assert [(d.host, d.weight) for d in split.destinations] == [
        ("v1.infra.svc.cluster.local", 1),
        ("nope.infra.invalid", 1),
    ]
    # A rule with no backend that resolves answers 500 (it does not fall through to others).
    for path in ("/p(/.*)?", "/k(/.*)?"):
        fault = by_path[path].fault
        assert fault is not None and fault.abort_status == 500, path
    message = status_of(mesh, "HTTPRoute", "infra", "r").parents[0].conditions[1].message
    assert "nope" in message and "9999" in message and "ConfigMap" in message


def test_hostnames_intersect_with_listeners() -> None:
    mesh = load(
        *BASE,
        gateway(
            listeners=[
                listener("wild", 8080, hostname="*.example.com"),
                listener("exact", 8081, hostname="a.other.com"),
            ]
        ),
        route("r", hostnames=["foo.example.com", "a.other.com", "nowhere.net"]),
        route("miss", hostnames=["nowhere.net"]),
    )
    hosts = sorted((v.http[0].matches[0].port, v.hosts) for v in mesh.virtual_services)
    assert hosts == [(8080, ("foo.example.com",)), (8081, ("a.other.com",))]
    assert conditions(mesh, "HTTPRoute", "infra", "miss")["Accepted"] == (
        "False/NoMatchingListenerHostname"
    )


def test_section_name_and_port_select_listeners() -> None:
    gw = gateway(listeners=[listener("a", 8080), listener("b", 8081)])
    mesh = load(
        *BASE,
        gw,
        route("by-name", parents=[{"name": "gw", "sectionName": "b"}]),
        route("by-port", parents=[{"name": "gw", "port": 8080}]),
        route("no-such", parents=[{"name": "gw", "sectionName": "zzz"}]),
        route("no-gw", parents=[{"name": "absent"}]),
    )
    ports = {r.name.split(".")[1]: r.matches[0].port for v in mesh.virtual_services for r in v.http}
    assert ports == {"by-name": 8081, "by-port": 8080}
    for name in ("no-such", "no-gw"):
        assert conditions(mesh, "HTTPRoute", "infra", name)["Accepted"] == "False/NoMatchingParent"
    listeners = {
        ls.name: ls.attached_routes for ls in status_of(mesh, "Gateway", "infra", "gw").listeners
    }
    assert listeners == {"a": 1, "b": 1}


def test_listener_kinds_restrict_routes() -> None:
    mesh = load(
        *BASE,
        gateway(listeners=[listener(kinds=["GRPCRoute"])]),
        route("h"),
        route("g", kind="GRPCRoute"),
    )
    assert conditions(mesh, "HTTPRoute", "infra", "h")["Accepted"] == "False/NotAllowedByListeners"
    assert conditions(mesh, "GRPCRoute", "infra", "g")["Accepted"] == "True/Accepted"
    bad = load(*BASE, gateway(listeners=[listener(kinds=["TCPRoute"])]))
    (ls,) = status_of(bad, "Gateway", "infra", "gw").listeners
    assert {c.type: c.reason for c in ls.conditions}["ResolvedRefs"] == "InvalidRouteKinds"
    assert bad.gateways[0].servers == ()  # nothing it could carry
    # Some kinds it can carry: reported, and it serves those.
    some = load(*BASE, gateway(listeners=[listener(kinds=["TCPRoute", "HTTPRoute"])]), route("h"))
    (ls,) = status_of(some, "Gateway", "infra", "gw").listeners
    reasons = {c.type: c.reason for c in ls.conditions}
    assert reasons["ResolvedRefs"] == "InvalidRouteKinds" and reasons["Programmed"] == "Programmed"
    assert ls.supported_kinds == ((GROUP, "HTTPRoute"),)
    assert conditions(some, "HTTPRoute", "infra", "h")["Accepted"] == "True/Accepted"


def test_tls_and_tcp_routes() -> None:
    mesh = load(
        *BASE,
        gateway(
            listeners=[
                listener("tls", 9443, "TLS", tls={"mode": "Passthrough"}),
                listener("tcp", 9000, "TCP"),
            ]
        ),
        route(
            "t",
            kind="TLSRoute",
            api_version=f"{GROUP}/v1alpha2",
            hostnames=["secure.example.com"],
            rules=[{"backendRefs": [backend("v1")]}],
        ),
        route(
            "c",
            kind="TCPRoute",
            api_version=f"{GROUP}/v1alpha2",
            rules=[{"backendRefs": [backend("v2", weight=3), backend("v1", weight=1)]}],
        ),
    )
    by_name = {v.name: v for v in mesh.virtual_services}
    tls = by_name["tlsroute-infra-t-9443"]
    assert tls.tls[0].sni_hosts == ("secure.example.com",) and tls.tls[0].ports == (9443,)
    tcp = by_name["tcproute-infra-c-9000"]
    assert tcp.tcp[0].ports == (9000,)
    assert [d.weight for d in tcp.tcp[0].destinations] == [3, 1]


def test_sidecars_do_not_see_gateway_virtual_services() -> None:
    mesh = load(*BASE, gateway(), route("r", rules=[{"backendRefs": [backend("v1")]}]))
    assert only_vs(mesh).hosts == ("*",)
    services = {s.hostname: s for s in mesh.services}
    index = TrafficIndex(mesh, services)
    assert index.virtual_service("v1.infra.svc.cluster.local", "") is None


# --- pieces ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("listener_host", "route_host", "want"),
    [
        ("", "a.example.com", "a.example.com"),
        ("a.example.com", "a.example.com", "a.example.com"),
        ("*.example.com", "a.example.com", "a.example.com"),
        ("*.example.com", "a.b.example.com", "a.b.example.com"),
        ("*.example.com", "example.com", None),
        ("a.example.com", "*.example.com", "a.example.com"),
        ("*.example.com", "*.a.example.com", "*.a.example.com"),
        ("*.a.example.com", "*.example.com", "*.a.example.com"),
        ("a.example.com", "b.example.com", None),
        ("*.example.com", "*.other.com", None),
    ],
)
def test_hostname_intersection(listener_host: str, route_host: str, want: str | None) -> None:
    assert intersect(listener_host, route_host) == want


def test_route_without_hostnames_takes_the_listeners() -> None:
    assert route_hosts("*.example.com", ()) == ("*.example.com",)
    assert route_hosts("", ()) == ("*",)


def test_reference_granted() -> None:
    src = SourceRef("ReferenceGrant", "certs", "g")
    grant = ReferenceGrant(
        "certs",
        "g",
        src,
        (GrantFrom(GROUP, "Gateway", "infra"),),
        (GrantTo("", "Secret", "tls"),),
    )
    from_gw = (GROUP, "Gateway", "infra")
    assert reference_granted([grant], from_gw, ("", "Secret", "certs", "tls"))
    assert not reference_granted([grant], from_gw, ("", "Secret", "certs", "other"))
    assert not reference_granted([grant], (GROUP, "Gateway", "x"), ("", "Secret", "certs", "tls"))
    assert not reference_granted([], from_gw, ("", "Secret", "certs", "tls"))
    # Within one namespace no grant is needed.
    assert reference_granted([], (GROUP, "Gateway", "certs"), ("", "Secret", "certs", "tls"))


def test_a_route_attached_through_two_listeners_of_one_port_is_served_once() -> None:
    mesh = load(
        *BASE,
        gateway(
            listeners=[
                listener("wild", 8080, hostname="*.example.com"),
                listener("exact", 8080, hostname="a.example.com"),
            ]
        ),
        route("r", hostnames=["a.example.com"]),
    )
    vs = only_vs(mesh)
    assert vs.hosts == ("a.example.com",) and len(vs.http) == 1
    attached = {
        ls.name: ls.attached_routes for ls in status_of(mesh, "Gateway", "infra", "gw").listeners
    }
    assert attached == {"wild": 1, "exact": 1}


def test_only_routers_in_the_gateways_namespace_serve_it() -> None:
    mesh = load(*BASE, gateway(), route("r"))
    (gw,) = mesh.gateways
    labels = ((GATEWAY_NAME_LABEL, "gw"),)
    assert gw.selects(labels, "infra")
    assert not gw.selects(labels, "elsewhere")
    ctx = GenContext(MeshIndex(mesh, ()), ResourceCache())

    def listeners(namespace: str) -> list[str]:
        proxy = proxy_from_node(
            f"router~10.1.0.9~gw-0.{namespace}~{namespace}.svc.cluster.local",
            {"LABELS": {GATEWAY_NAME_LABEL: "gw"}, "SDS": "true"},
        )
        return sorted(generators_for(proxy)[LISTENER_TYPE](ctx, proxy))

    assert listeners("infra") == ["10.1.0.9_8080"]
    assert listeners("elsewhere") == []
