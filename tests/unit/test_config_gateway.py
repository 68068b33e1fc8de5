"""The Istio `Gateway` kind and VirtualService gateway binding: conversion, host forms, TLS
validation with file:line, unsupported modes reported (server left out), and which part of a
VirtualService applies to sidecars and to each gateway."""

from __future__ import annotations

import textwrap

import pytest

from control.config.errors import ConfigError, DuplicateObjectError
from control.config.loader import load_text
from control.config.merge import check_duplicates, merge
from control.config.objects import ConfigObject
from control.model.gateway import ServerTls, ServerTlsMode
from control.model.traffic import bound_to
from control.model.types import Protocol, SourceRef


def load(text: str) -> object:
    return load_text(textwrap.dedent(text).lstrip("\n"), "g.yaml")


GATEWAY = """
apiVersion: networking.istio.io/v1beta1
kind: Gateway
metadata: {name: public, namespace: edge}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: ["bookinfo.example.com", "./local.example.com", "shop/*.shop.example.com", "*/*"]
    tls: {httpsRedirect: true}
  - port: {number: 443, name: https, protocol: HTTPS}
    hosts: ["*.example.com"]
    bind: 127.0.1.40
    tls:
      mode: SIMPLE
      serverCertificate: /certs/a.pem
      privateKey: /certs/a.key
      minProtocolVersion: TLSV1_2
  - port: {number: 8443, name: mtls, protocol: HTTPS}
    hosts: ["*"]
    tls: {mode: MUTUAL, credentialName: shop-cert}
  - port: {number: 9443, name: pass, protocol: TLS}
    hosts: ["*"]
    tls: {mode: PASSTHROUGH}
  - port: {number: 15443, name: mesh, protocol: TLS}
    hosts: ["*"]
    tls: {mode: ISTIO_MUTUAL}
  - port: {number: 3306, name: db, protocol: TCP}
    hosts: ["*"]
"""


def test_gateway_converts_every_server_form() -> None:
    fc = load(GATEWAY)
    assert [str(w) for w in fc.warnings] == []  # type: ignore[attr-defined]
    (gw,) = fc.objects[0].gateways  # type: ignore[attr-defined]
    assert gw.ref == "edge/public"
    assert gw.selector == (("istio", "ingressgateway"),)
    assert gw.selects((("istio", "ingressgateway"), ("app", "x")))
    assert not gw.selects((("istio", "egress"),))
    http, https, mtls, passthrough, mesh, db = gw.servers
    assert http.hosts == (
        "*/bookinfo.example.com",
        "edge/local.example.com",
        "shop/*.shop.example.com",
        "*/*",
    )
    assert http.protocol is Protocol.HTTP and http.tls == ServerTls(https_redirect=True)
    assert https.bind == "127.0.1.40"
    assert https.tls == ServerTls(
        mode=ServerTlsMode.SIMPLE,
        server_certificate="/certs/a.pem",
        private_key="/certs/a.key",
        min_protocol_version="TLSV1_2",
    )
    assert mtls.tls is not None and mtls.tls.credential_name == "shop-cert"
    assert mtls.tls.mode is ServerTlsMode.MUTUAL
    assert passthrough.tls == ServerTls(mode=ServerTlsMode.PASSTHROUGH)
    assert mesh.tls is not None and mesh.tls.mode is ServerTlsMode.ISTIO_MUTUAL
    assert db.protocol is Protocol.TCP and db.tls is None
    config = merge([fc])  # type: ignore[list-item]
    assert config.gateways == (gw,)


def _gateway_with(server: str) -> str:
    return (
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: g}\nspec:\n"
        "  selector: {app: gw}\n  servers:\n" + textwrap.indent(server, "  ")
    )


@pytest.mark.parametrize(
    ("server", "line", "message"),
    [
        ("- port: {number: 443, protocol: HTTPS}\n  hosts: ['*']\n", 7, "tls: is required"),
        (
            "- port: {number: 443, protocol: HTTPS}\n  hosts: ['*']\n  tls: {mode: SIMPLE}\n",
            9,
            "SIMPLE needs credentialName, or serverCertificate and privateKey",
        ),
        (
            "- port: {number: 443, protocol: HTTPS}\n  hosts: ['*']\n"
            "  tls: {mode: MUTUAL, serverCertificate: /a, privateKey: /b}\n",
            9,
            "caCertificates: is required for MUTUAL",
        ),
        (
            "- port: {number: 443, protocol: HTTPS}\n  hosts: ['*']\n"
            "  tls: {mode: ISTIO_MUTUAL, credentialName: x}\n",
            9,
            "ISTIO_MUTUAL uses the router's mesh certificate",
        ),
        (
            "- port: {number: 80, protocol: HTTP}\n  hosts: ['*']\n  tls: {mode: SIMPLE}\n",
            9,
            "a plaintext HTTP server cannot have TLS settings",
        ),
        ("- port: {number: 80, protocol: UDP}\n  hosts: ['*']\n", 7, "protocol"),
        ("- port: {number: 80, protocol: HTTP}\n", 7, "hosts: is required"),
        ("- port: {number: 80, protocol: HTTP}\n  hosts: ['a/b/c']\n", 8, "host 'b/c'"),
        ("- port: {number: 80, protocol: HTTP}\n  hosts: ['Bad_NS/x.com']\n", 8, "namespace"),
        ("- port: {number: 80, protocol: HTTP}\n  hosts: ['*']\n  bind: eth0\n", 9, "bind"),
        (
            "- port: {number: 80, name: web, protocol: HTTP}\n  hosts: ['*']\n"
            "- port: {number: 81, name: web, protocol: HTTP}\n  hosts: ['*']\n",
            9,
            "port name 'web' is already used by spec.servers[0]",
        ),
        (
            "- port: {number: 443, protocol: HTTPS}\n  hosts: ['*']\n"
            "  tls: {credentialName: c, minProtocolVersion: TLSV1_3, "
            "maxProtocolVersion: TLSV1_2}\n",
            9,
            "maxProtocolVersion: TLSV1_2 is older than minProtocolVersion TLSV1_3",
        ),
    ],
)
def test_invalid_servers_fail_with_file_and_line(server: str, line: int, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(_gateway_with(server), "g.yaml")
    assert info.value.file == "g.yaml"
    assert info.value.line == line, str(info.value)
    assert message in str(info.value)


def test_unserved_tls_mode_is_reported_and_only_that_server_dropped() -> None:
    fc = load(
        _gateway_with(
            "- port: {number: 443, protocol: TLS}\n  hosts: ['*']\n"
            "  tls: {mode: AUTO_PASSTHROUGH}\n"
            "- port: {number: 80, protocol: HTTP}\n  hosts: ['*']\n"
        )
    )
    (gw,) = fc.objects[0].gateways  # type: ignore[attr-defined]
    assert [s.port for s in gw.servers] == [80]
    (warning,) = fc.warnings  # type: ignore[attr-defined]
    assert "spec.servers[0].tls.mode: AUTO_PASSTHROUGH is not supported; server ignored" in str(
        warning
    )


def test_optional_mutual_and_cipher_suites() -> None:
    fc = load(
        _gateway_with(
            "- port: {number: 443, protocol: HTTPS}\n  hosts: ['*']\n"
            "  tls:\n    mode: OPTIONAL_MUTUAL\n    credentialName: c\n"
            "    cipherSuites: [ECDHE-ECDSA-AES128-GCM-SHA256, NOT-A-CIPHER,"
            " ECDHE-ECDSA-AES128-GCM-SHA256, AES256-SHA]\n"
        )
    )
    (gw,) = fc.objects[0].gateways  # type: ignore[attr-defined]
    (server,) = gw.servers
    assert server.tls.mode is ServerTlsMode.OPTIONAL_MUTUAL
    # Unknown names are dropped (Envoy would refuse the listener), repeats kept once.
    assert server.tls.cipher_suites == ("ECDHE-ECDSA-AES128-GCM-SHA256", "AES256-SHA")
    (warning,) = fc.warnings  # type: ignore[attr-defined]
    assert "cipherSuites[1]: unknown cipher suite 'NOT-A-CIPHER'; ignored" in str(warning)
    with pytest.raises(ConfigError, match="caCertificates: is required for OPTIONAL_MUTUAL"):
        load(
            _gateway_with(
                "- port: {number: 443, protocol: HTTPS}\n  hosts: ['*']\n"
                "  tls: {mode: OPTIONAL_MUTUAL, serverCertificate: /c, privateKey: /k}\n"
            )
        )


def test_empty_selector_is_reported() -> None:
    fc = load(
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: g}\nspec:\n"
        "  servers: [{port: {number: 80, protocol: HTTP}, hosts: ['*']}]\n"
    )
    assert "selects no router" in str(fc.warnings[0])  # type: ignore[attr-defined]


def test_istio_and_gateway_api_gateways_of_one_name_do_not_collide() -> None:
    def obj(api_version: str, line: int) -> ConfigObject:
        return ConfigObject(
            SourceRef("Gateway", "default", "web", "a.yaml", line),
            {"apiVersion": api_version, "kind": "Gateway"},
        )

    check_duplicates([obj("networking.istio.io/v1", 1), obj("gateway.networking.k8s.io/v1", 9)])
    # The same kind in two Istio versions is one object, defined twice.
    with pytest.raises(DuplicateObjectError):
        check_duplicates([obj("networking.istio.io/v1", 1), obj("networking.istio.io/v1beta1", 9)])


BOUND = """
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: bookinfo, namespace: shop}
spec:
  hosts: [bookinfo.example.com, reviews]
  gateways: [edge/public, mesh, shop-gw]
  http:
  - match: [{uri: {prefix: /api}, gateways: [edge/public]}, {uri: {prefix: /both}}]
    route: [{destination: {host: reviews}}]
  - match: [{uri: {prefix: /gw-only}, gateways: [shop-gw]}]
    route: [{destination: {host: reviews}}]
  - route: [{destination: {host: productpage}}]
  tcp:
  - match: [{port: 3306, gateways: [edge/public]}]
    route: [{destination: {host: db, port: {number: 3306}}}]
  tls:
  - match: [{port: 443, sniHosts: [bookinfo.example.com]}]
    route: [{destination: {host: reviews, port: {number: 9443}}}]
"""


def test_virtual_service_gateways_resolve_and_bind_as_istio() -> None:
    fc = load(BOUND)
    (vs,) = fc.objects[0].virtual_services  # type: ignore[attr-defined]
    assert vs.gateways == ("edge/public", "mesh", "shop/shop-gw")
    assert vs.hosts == ("bookinfo.example.com", "reviews.shop.svc.cluster.local")
    (tls,) = vs.tls
    assert tls.sni_hosts == ("bookinfo.example.com",) and tls.ports == (443,)
    assert tls.destinations[0].host == "reviews.shop.svc.cluster.local"
    assert vs.tcp[0].gateways == ("edge/public",)
    # TLS routes serve sidecars too (bound to `mesh`), as in Istio: nothing to warn about.
    assert fc.warnings == ()  # type: ignore[attr-defined]

    mesh = bound_to(vs, "mesh")
    assert mesh is not None
    # The match for edge/public only is gone; the route whose only match is for another
    # gateway is gone (it must not become a catch-all); the tcp route is the gateway's.
    assert [[m.uri.value for m in r.matches] for r in mesh.http] == [["/both"], []]  # type: ignore[union-attr]
    assert mesh.tcp == ()
    public = bound_to(vs, "edge/public")
    assert public is not None
    assert [[m.uri.value for m in r.matches] for r in public.http] == [["/api", "/both"], []]  # type: ignore[union-attr]
    assert public.tcp == vs.tcp
    shop = bound_to(vs, "shop/shop-gw")
    assert shop is not None and len(shop.http) == 3
    assert bound_to(vs, "edge/other") is None


def test_virtual_service_without_gateways_is_for_sidecars_only() -> None:
    fc = load(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: r}\n"
        "spec:\n  hosts: [reviews]\n  http: [{route: [{destination: {host: reviews}}]}]\n"
    )
    (vs,) = fc.objects[0].virtual_services  # type: ignore[attr-defined]
    assert vs.gateways == ("mesh",)
    assert bound_to(vs, "mesh") is vs  # unchanged: sidecar config keyed by it stays shared
    assert bound_to(vs, "default/public") is None


@pytest.mark.parametrize(
    ("tail", "message"),
    [
        (
            "  tls:\n  - match: [{sniHosts: [other.example.com]}]\n"
            "    route: [{destination: {host: a}}]\n",
            "sniHost 'other.example.com' is not one of the VirtualService's hosts",
        ),
        (
            "  tls:\n  - match: [{port: 443}]\n    route: [{destination: {host: a}}]\n",
            "sniHosts: is required",
        ),
        (
            "  tcp:\n  - match: [{port: 1, gateways: [g1]}, {port: 2}]\n"
            "    route: [{destination: {host: a}}]\n",
            "every match of one route must name the same gateways",
        ),
        (
            "  gateways: [Bad_Name]\n  http: [{route: [{destination: {host: a}}]}]\n",
            "gateway name 'Bad_Name'",
        ),
    ],
)
def test_bad_gateway_routes_fail(tail: str, message: str) -> None:
    text = (
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: r}\n"
        "spec:\n  hosts: [a.example.com]\n" + tail
    )
    with pytest.raises(ConfigError) as info:
        load_text(text, "v.yaml")
    assert message in str(info.value)
    assert info.value.line > 1
