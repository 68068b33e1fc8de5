"""What a router gets: servers merged per port with Istio's conflict rules, VirtualServices
bound by gateway and host, listeners at the right address, SNI chains, RDS by Istio's names,
certificates named as the agent serves them, and nothing sidecar-shaped. Sidecars keep seeing
only what is bound to `mesh`."""

from __future__ import annotations

import logging
import textwrap

import pytest
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)
from envoy.extensions.filters.network.tcp_proxy.v3.tcp_proxy_pb2 import TcpProxy
from envoy.extensions.transport_sockets.tls.v3.tls_pb2 import DownstreamTlsContext
from google.protobuf import any_pb2
from google.protobuf.message import Message

from control.generate import GENERATORS, ROUTER_GENERATORS, generators_for
from control.generate.context import GenContext
from control.generate.resource_names import CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE
from control.generate.warn import warn_once
from control.model.gateway_index import host_intersection, merge_servers
from control.model.index import MeshIndex
from control.model.proxy import Proxy, proxy_from_node
from control.model.types import MeshConfig
from control.xds.cache import ResourceCache, ResourceSet
from protos.typeurls import NAME_TABLE
from tests.support.gateways import GATEWAY_MESH, SERVICES, router
from tests.support.traffic import mesh_config

M = type[Message]


def unpack(resource_set: ResourceSet, name: str, cls: M) -> Message:
    any_msg = any_pb2.Any()
    any_msg.ParseFromString(resource_set[name].any_bytes)
    out = cls()
    assert any_msg.Unpack(out)
    return out


def generate(config: MeshConfig, proxy: Proxy) -> dict[str, ResourceSet]:
    ctx = GenContext(MeshIndex(config, []), ResourceCache())
    return {t: gen(ctx, proxy) for t, gen in generators_for(proxy).items()}


def test_router_gets_the_router_table() -> None:
    proxy = router()
    assert generators_for(proxy) is ROUTER_GENERATORS
    # DNS proxying is a sidecar's: no name table for routers.
    assert NAME_TABLE not in ROUTER_GENERATORS
    assert generators_for(proxy_from_node("sidecar~1.2.3.4~a.b~b.svc", {})) is GENERATORS


def test_listeners_bind_the_router_ip_in_mode_none_and_every_address_otherwise() -> None:
    config = mesh_config(GATEWAY_MESH)
    none = generate(config, router())[LISTENER_TYPE]
    assert sorted(none) == [
        "127.0.1.40_443",  # bind overrides
        "127.0.1.9_3306",
        "127.0.1.9_80",
        "127.0.1.9_8443",
        "127.0.1.9_9443",
    ]
    redirect = generate(config, router(mode="REDIRECT"))[LISTENER_TYPE]
    assert "0.0.0.0_80" in redirect and "127.0.1.40_443" in redirect
    # Nothing sidecar-shaped: no inbound listeners or clusters, no virtualOutbound.
    assert not any("virtual" in n for n in redirect)
    clusters = generate(config, router(mode="REDIRECT"))[CLUSTER_TYPE]
    assert not any(n.startswith("inbound|") for n in clusters)


def test_a_router_no_gateway_selects_gets_no_listeners() -> None:
    config = mesh_config(GATEWAY_MESH)
    sets = generate(config, router(labels={"istio": "egressgateway"}))
    assert len(sets[LISTENER_TYPE]) == 0 and len(sets[ROUTE_TYPE]) == 0
    # Clusters are the mesh's (a gateway sees every service), ready for when one selects it.
    assert "outbound|9080||reviews.default.svc.cluster.local" in sets[CLUSTER_TYPE]
    assert "outbound|9080||reviews.default.svc.cluster.local" in sets[ENDPOINT_TYPE]


def test_http_routes_by_host_and_path_with_redirect_and_404_for_unknown_hosts() -> None:
    sets = generate(mesh_config(GATEWAY_MESH), router())
    listener = unpack(sets[LISTENER_TYPE], "127.0.1.9_80", Listener)
    hcm = HttpConnectionManager()
    assert listener.filter_chains[0].filters[0].typed_config.Unpack(hcm)  # type: ignore[attr-defined]
    assert hcm.rds.route_config_name == "http.80"
    assert hcm.use_remote_address.value
    assert hcm.forward_client_cert_details == HttpConnectionManager.SANITIZE_SET
    routes = unpack(sets[ROUTE_TYPE], "http.80", RouteConfiguration)
    vhosts = {v.name: v for v in routes.virtual_hosts}  # type: ignore[attr-defined]
    assert sorted(vhosts) == ["plain.example.com:80", "secure.example.com:80"]
    plain = vhosts["plain.example.com:80"]
    assert list(plain.domains) == ["plain.example.com", "plain.example.com:80"]
    assert [(r.match.prefix, r.route.cluster) for r in plain.routes] == [
        ("/ratings", "outbound|9080||ratings.default.svc.cluster.local"),
        ("/", "outbound|9080||reviews.default.svc.cluster.local"),
    ]
    # httpsRedirect is the server's: only its hosts redirect (Envoy answers 301).
    assert vhosts["secure.example.com:80"].require_tls == vhosts["secure.example.com:80"].ALL
    assert plain.require_tls == plain.NONE
    # No catch-all: an unknown Host gets Envoy's 404.
    assert not any("*" in d for v in routes.virtual_hosts for d in v.domains)  # type: ignore[attr-defined]


def test_https_servers_terminate_per_sni_with_the_agents_secret_names() -> None:
    sets = generate(mesh_config(GATEWAY_MESH), router())
    listener = unpack(sets[LISTENER_TYPE], "127.0.1.40_443", Listener)
    assert [f.name for f in listener.listener_filters] == ["envoy.filters.listener.tls_inspector"]  # type: ignore[attr-defined]
    chains = {tuple(c.filter_chain_match.server_names): c for c in listener.filter_chains}  # type: ignore[attr-defined]
    assert sorted(chains) == [("a.example.com",), ("b.example.com",)]
    names = {}
    for sni, chain in chains.items():
        tls = DownstreamTlsContext()
        assert chain.transport_socket.typed_config.Unpack(tls)
        common = tls.common_tls_context
        names[sni[0]] = common.tls_certificate_sds_secret_configs[0].name
        assert list(common.alpn_protocols) == ["h2", "http/1.1"]
        assert not tls.require_client_certificate.value
        # A bad certificate file must not hold the listener back forever.
        sds = common.tls_certificate_sds_secret_configs[0].sds_config
        assert sds.initial_fetch_timeout.seconds > 0
    assert names == {
        "a.example.com": "file-cert:/certs/a.pem~/certs/a.key",
        "b.example.com": "file-cert:/certs/b.pem~/certs/b.key",
    }
    assert "https.443.https-a.a.edge" in sets[ROUTE_TYPE]
    assert "https.443.https-b.b.edge" in sets[ROUTE_TYPE]


def test_mutual_and_credential_name_secrets() -> None:
    sets = generate(mesh_config(GATEWAY_MESH), router())
    listener = unpack(sets[LISTENER_TYPE], "127.0.1.9_8443", Listener)
    (chain,) = listener.filter_chains  # type: ignore[attr-defined]
    tls = DownstreamTlsContext()
    assert chain.transport_socket.typed_config.Unpack(tls)
    assert tls.require_client_certificate.value
    common = tls.common_tls_context
    assert common.tls_certificate_sds_secret_configs[0].name == "kubernetes://shop-cert"
    validation = common.combined_validation_context
    assert validation.validation_context_sds_secret_config.name == "kubernetes://shop-cert-cacert"
    sans = [
        m.matcher.exact for m in validation.default_validation_context.match_typed_subject_alt_names
    ]
    assert "client.example.com" in sans


def test_passthrough_routes_by_sni_and_tcp_server_proxies() -> None:
    sets = generate(mesh_config(GATEWAY_MESH), router())
    listener = unpack(sets[LISTENER_TYPE], "127.0.1.9_9443", Listener)
    (chain,) = listener.filter_chains  # type: ignore[attr-defined]
    assert list(chain.filter_chain_match.server_names) == ["pass.example.com"]
    assert not chain.HasField("transport_socket")  # not terminated
    proxy = TcpProxy()
    assert chain.filters[0].typed_config.Unpack(proxy)
    assert proxy.cluster == "outbound|9443||tlsbackend.default.svc.cluster.local"
    db = unpack(sets[LISTENER_TYPE], "127.0.1.9_3306", Listener)
    assert db.filter_chains[0].filters[0].typed_config.Unpack(proxy)  # type: ignore[attr-defined]
    assert proxy.cluster == "outbound|3306||db.default.svc.cluster.local"


def test_sidecars_see_only_mesh_bound_routes() -> None:
    config = mesh_config(GATEWAY_MESH)
    sidecar = proxy_from_node("sidecar~127.0.1.3~client.default~default.svc.cluster.local", {})
    routes = generate(config, sidecar)[ROUTE_TYPE]
    table = unpack(routes, "9080", RouteConfiguration)
    reviews = next(v for v in table.virtual_hosts if v.name.startswith("reviews."))  # type: ignore[attr-defined]
    # The gateway-only VirtualService (path /ratings) does not reach the sidecar.
    assert [r.name for r in reviews.routes] == ["default"]
    assert not any(n.startswith("http.") for n in routes)


def _gateway(name: str, servers: str, namespace: str = "edge") -> str:
    return textwrap.dedent(
        f"""
        ---
        apiVersion: networking.istio.io/v1
        kind: Gateway
        metadata: {{name: {name}, namespace: {namespace}}}
        spec:
          selector: {{istio: ingressgateway}}
          servers:
        """
    ) + textwrap.indent(textwrap.dedent(servers), "  ")


CONFLICTS = "".join(
    (
        _gateway(
            "b-second",
            """
            - port: {number: 8080, name: web, protocol: TCP}
              hosts: ["*"]
            - port: {number: 443, name: dup, protocol: HTTPS}
              hosts: [a.example.com, c.example.com]
              tls: {mode: SIMPLE, serverCertificate: /c.pem, privateKey: /c.key}
            """,
        ),
        _gateway(
            "a-first",
            """
            - port: {number: 8080, name: web, protocol: HTTP}
              hosts: ["*"]
            - port: {number: 443, name: tls, protocol: HTTPS}
              hosts: [a.example.com]
              tls: {mode: SIMPLE, serverCertificate: /a.pem, privateKey: /a.key}
            """,
        ),
    )
)


def test_conflicting_servers_one_warning_each_and_a_fixed_winner(
    caplog: pytest.LogCaptureFixture,
) -> None:
    warn_once.clear()
    config = mesh_config(CONFLICTS)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):  # every push: the same warning, logged once
            sets = generate(config, router())
    messages = [r.getMessage() for r in caplog.records if "conflicts with" in r.getMessage()]
    assert len(messages) == 2, messages
    host, protocol = sorted(messages)  # port 443, port 8080
    # The oldest by namespace/name wins whichever file order; both are named.
    assert "Gateway edge/b-second" in protocol and "Gateway edge/a-first" in protocol
    assert "protocol TCP cannot share the port with HTTP" in protocol
    assert "duplicate host a.example.com" in host
    listener = unpack(sets[LISTENER_TYPE], "127.0.1.9_8080", Listener)
    hcm = HttpConnectionManager()
    assert listener.filter_chains[0].filters[0].typed_config.Unpack(hcm)  # type: ignore[attr-defined]
    tls = unpack(sets[LISTENER_TYPE], "127.0.1.9_443", Listener)
    served = sorted(n for c in tls.filter_chains for n in c.filter_chain_match.server_names)  # type: ignore[attr-defined]
    # b-second keeps the host nobody had first.
    assert served == ["a.example.com", "c.example.com"]


def test_merge_keeps_http_servers_of_several_gateways_on_one_port() -> None:
    config = mesh_config(
        _gateway("one", '- port: {number: 80, protocol: HTTP}\n  hosts: ["*"]\n'),
        _gateway("two", '- port: {number: 80, protocol: HTTP2}\n  hosts: ["*"]\n'),
    )
    listeners, conflicts = merge_servers(config.gateways, "127.0.1.9")
    (listener,) = listeners
    assert conflicts == ()
    assert [b.gateway.name for b in listener.servers] == ["one", "two"]


@pytest.mark.parametrize(
    ("a", "b", "both"),
    [
        ("*", "x.com", "x.com"),
        ("*.example.com", "a.example.com", "a.example.com"),
        ("a.example.com", "*.example.com", "a.example.com"),
        ("*.example.com", "*.a.example.com", "*.a.example.com"),
        ("a.com", "b.com", None),
        ("*.example.com", "example.com", None),
        ("A.com", "a.com", "a.com"),
    ],
)
def test_host_intersection(a: str, b: str, both: str | None) -> None:
    assert host_intersection(a, b) == both


def test_server_port_is_the_router_services_port_as_istio() -> None:
    """A Gateway's `port: 80` behind a Service mapping 80 -> 8080 (the ingress gateway
    Service): the listener listens on 8080; Host and route matching stay on 80."""
    service = textwrap.dedent(
        """
        ---
        apiVersion: v1
        kind: Service
        metadata: {name: istio-ingressgateway, namespace: edge}
        spec:
          selector: {istio: ingressgateway}
          ports: [{name: http, port: 80, targetPort: 8080}]
        """
    )
    sets = generate(mesh_config(GATEWAY_MESH, service), router())
    assert "127.0.1.9_8080" in sets[LISTENER_TYPE] and "127.0.1.9_80" not in sets[LISTENER_TYPE]
    listener = unpack(sets[LISTENER_TYPE], "127.0.1.9_8080", Listener)
    hcm = HttpConnectionManager()
    assert listener.filter_chains[0].filters[0].typed_config.Unpack(hcm)  # type: ignore[attr-defined]
    assert hcm.rds.route_config_name == "http.8080"
    routes = unpack(sets[ROUTE_TYPE], "http.8080", RouteConfiguration)
    plain = next(v for v in routes.virtual_hosts if v.name.startswith("plain."))  # type: ignore[attr-defined]
    assert list(plain.domains) == ["plain.example.com", "plain.example.com:80"]
    # A router the Service does not select keeps the server's own port.
    other = generate(mesh_config(GATEWAY_MESH, service), router(namespace="other"))
    assert "127.0.1.9_80" in other[LISTENER_TYPE]


def test_binding_follows_server_host_namespaces_and_export_to() -> None:
    """`shop/*` binds only VirtualServices of shop; a VirtualService exported only to its
    own namespace is not bound by a Gateway elsewhere; a bare gateway name is the
    VirtualService's namespace."""
    gateway = _gateway(
        "gw",
        """
        - port: {number: 80, protocol: HTTP}
          hosts: ["shop/*", "*/open.example.com"]
        """,
    )

    def vs(name: str, namespace: str, host: str, extra: str = "") -> str:
        return (
            textwrap.dedent(
                f"""
            ---
            apiVersion: networking.istio.io/v1
            kind: VirtualService
            metadata: {{name: {name}, namespace: {namespace}}}
            spec:
              hosts: [{host}]
              gateways: [edge/gw]
              http: [{{route: [{{destination: {{host: reviews.default.svc.cluster.local}}}}]}}]
            """
            )
            + extra
        )

    config = mesh_config(
        SERVICES,
        gateway,
        vs("in-shop", "shop", "shop.example.com"),
        vs("elsewhere", "default", "other.example.com"),
        vs("open", "default", "open.example.com"),
        vs("private", "default", "open2.example.com", "  exportTo: ['.']\n"),
        _gateway("local", '- port: {number: 81, protocol: HTTP}\n  hosts: ["*"]\n', "shop"),
        textwrap.dedent(
            """
            ---
            apiVersion: networking.istio.io/v1
            kind: VirtualService
            metadata: {name: bare, namespace: shop}
            spec:
              hosts: [bare.example.com]
              gateways: [local]
              http: [{route: [{destination: {host: reviews.default.svc.cluster.local}}]}]
            """
        ),
    )
    sets = generate(config, router())
    http80 = unpack(sets[ROUTE_TYPE], "http.80", RouteConfiguration)
    assert sorted(v.name for v in http80.virtual_hosts) == [  # type: ignore[attr-defined]
        "open.example.com:80",
        "shop.example.com:80",
    ]
    http81 = unpack(sets[ROUTE_TYPE], "http.81", RouteConfiguration)
    assert [v.name for v in http81.virtual_hosts] == ["bare.example.com:81"]  # type: ignore[attr-defined]


def test_tls_versions_reach_the_downstream_context() -> None:
    from envoy.extensions.transport_sockets.tls.v3.common_pb2 import TlsParameters

    config = mesh_config(
        GATEWAY_MESH,
        _gateway(
            "versions",
            """
            - port: {number: 7443, protocol: HTTPS}
              hosts: [v.example.com]
              tls: {credentialName: v, minProtocolVersion: TLSV1_3, maxProtocolVersion: TLSV1_3}
            """,
        ),
    )
    sets = generate(config, router())
    listener = unpack(sets[LISTENER_TYPE], "127.0.1.9_7443", Listener)
    tls = DownstreamTlsContext()
    assert listener.filter_chains[0].transport_socket.typed_config.Unpack(tls)  # type: ignore[attr-defined]
    params = tls.common_tls_context.tls_params
    assert params.tls_minimum_protocol_version == TlsParameters.TLSv1_3
    assert params.tls_maximum_protocol_version == TlsParameters.TLSv1_3
    # Unset: Istio's gateway default, TLS 1.2 at least.
    a = unpack(sets[LISTENER_TYPE], "127.0.1.40_443", Listener)
    assert a.filter_chains[0].transport_socket.typed_config.Unpack(tls)  # type: ignore[attr-defined]
    assert tls.common_tls_context.tls_params.tls_minimum_protocol_version == TlsParameters.TLSv1_2
