"""Proxyless mTLS in generated config: which endpoints accept only mTLS (the proxyless rule for
PeerAuthentication), the UpstreamTlsContext of gRPC clusters (auto mTLS, DestinationRule tls),
the listeners gRPC xDS servers ask for, and the fields gRPC would reject (gRFC A29, A36)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.rbac.v3.rbac_pb2 import RBAC, Permission, Principal
from envoy.extensions.filters.http.rbac.v3.rbac_pb2 import RBAC as HttpRBAC
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)
from envoy.extensions.transport_sockets.tls.v3.tls_pb2 import (
    CommonTlsContext,
    DownstreamTlsContext,
    UpstreamTlsContext,
)

from control.generate import grpc_clusters, grpc_listeners
from control.generate.context import GenContext
from control.generate.warn import warn_once
from control.model.index import MeshIndex, endpoints_only
from control.model.proxy import Proxy, proxy_from_node
from control.model.traffic import ClientTls, DestinationRule, TlsMode, TrafficPolicy
from control.model.types import (
    AuthorizationPolicy,
    AuthzAction,
    AuthzOperation,
    AuthzRule,
    AuthzSource,
    MeshConfig,
    MtlsMode,
    PeerAuthentication,
    Protocol,
    Service,
    ServicePort,
    SourceRef,
    Workload,
    labels_of,
    proxyless_tls,
)
from control.xds.cache import ResourceCache
from tests.unit.test_generate_security import unpack
from tests.unit.test_generate_sidecar import decode_all, kube_service

ECHO = "echo.default.svc.cluster.local"
ECHO_CLUSTER = f"outbound|7070||{ECHO}"
ECHO_SAN = "spiffe://cluster.local/ns/default/sa/echo"
SERVER_IP = "127.0.5.1"


@pytest.fixture(autouse=True)
def _fresh_warnings() -> None:
    warn_once.clear()


def proxyless(
    ip: str, app: str, *, provider: bool = True, sa: str | None = None, **labels: str
) -> Proxy:
    meta: dict[str, Any] = {
        "GENERATOR": "grpc",
        "LABELS": {"app": app, **labels},
        "SERVICE_ACCOUNT": sa or app,
        "SDS": "true",
    }
    if provider:
        meta["CERTIFICATE_PROVIDER"] = "default"
    return proxy_from_node(f"sidecar~{ip}~{app}-1.default~default.svc.cluster.local", meta)


def envoy_sidecar(ip: str, app: str) -> Proxy:
    return proxy_from_node(
        f"sidecar~{ip}~{app}-1.default~default.svc.cluster.local",
        {"LABELS": {"app": app}, "SERVICE_ACCOUNT": app, "SDS": "true"},
    )


def plain_workload(name: str, ip: str, app: str) -> Workload:
    return Workload(
        name=name,
        namespace="default",
        address=ip,
        labels=labels_of({"app": app}),
        service_account=app,
        source=SourceRef("WorkloadEntry", "default", name),
    )


def peer(mode: MtlsMode, ns: str = "default", **kw: Any) -> PeerAuthentication:
    return PeerAuthentication(
        ns, "default", SourceRef("PeerAuthentication", ns, "default"), mode=mode, **kw
    )


def echo_service() -> Service:
    return kube_service("echo", "default", ServicePort("grpc", 7070, Protocol.GRPC, 8080))


def config(
    mode: MtlsMode | None = None,
    *,
    entries: tuple[Workload, ...] = (),
    rules: tuple[DestinationRule, ...] = (),
    extra: tuple[Service, ...] = (),
) -> MeshConfig:
    return MeshConfig(
        services=(echo_service(), *extra),
        workload_entries=entries,
        peer_authentications=(peer(mode),) if mode is not None else (),
        destination_rules=rules,
    )


def index(cfg: MeshConfig, *proxies: Proxy) -> MeshIndex:
    return MeshIndex(cfg, [p.as_workload() for p in proxies])


def ctx_of(cfg: MeshConfig, *proxies: Proxy) -> GenContext:
    return GenContext(index(cfg, *proxies), ResourceCache())


def echo_cluster(ctx: GenContext, client: Proxy) -> Cluster:
    return decode_all(grpc_clusters.generate_clusters(ctx, client), Cluster)[ECHO_CLUSTER]


def upstream(cluster: Cluster) -> UpstreamTlsContext | None:
    if not cluster.HasField("transport_socket"):
        return None
    assert cluster.transport_socket.name == "envoy.transport_sockets.tls"
    return unpack(cluster.transport_socket.typed_config, UpstreamTlsContext)


def assert_providers(common: CommonTlsContext, sans: list[str]) -> None:
    """Identity `default`/`default`, roots `default`/`ROOTCA`, in the current fields and their
    deprecated twins, SANs in the field gRPC reads; nothing gRPC rejects (SDS, files, params)."""
    assert common.tls_certificate_provider_instance.instance_name == "default"
    assert common.tls_certificate_provider_instance.certificate_name == "default"
    old = common.tls_certificate_certificate_provider_instance
    assert (old.instance_name, old.certificate_name) == ("default", "default")
    combined = common.combined_validation_context
    ca = combined.default_validation_context.ca_certificate_provider_instance
    assert (ca.instance_name, ca.certificate_name) == ("default", "ROOTCA")
    old_ca = combined.validation_context_certificate_provider_instance
    assert (old_ca.instance_name, old_ca.certificate_name) == ("default", "ROOTCA")
    matchers = combined.default_validation_context.match_subject_alt_names
    assert [m.exact for m in matchers] == sans
    assert not combined.default_validation_context.match_typed_subject_alt_names
    assert not common.tls_certificate_sds_secret_configs and not common.tls_certificates
    assert not combined.HasField("validation_context_sds_secret_config")
    assert not common.HasField("tls_params") and not common.alpn_protocols


# --- which endpoints take only mTLS -----------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "label", "tls"),
    [
        (MtlsMode.STRICT, False, True),
        (MtlsMode.STRICT, True, True),
        (MtlsMode.PERMISSIVE, False, False),
        (MtlsMode.PERMISSIVE, True, True),
        (MtlsMode.DISABLE, False, False),
        (MtlsMode.DISABLE, True, False),
    ],
)
def test_proxyless_tls_rule(mode: MtlsMode, label: bool, tls: bool) -> None:
    assert proxyless_tls(mode, label) is tls


@pytest.mark.parametrize(
    ("mode", "labels", "mtls", "tls_only"),
    [
        (MtlsMode.STRICT, {}, True, True),
        (MtlsMode.PERMISSIVE, {}, False, False),
        (MtlsMode.PERMISSIVE, {"security.istio.io/tlsMode": "istio"}, True, True),
        (MtlsMode.DISABLE, {"security.istio.io/tlsMode": "istio"}, False, False),
    ],
)
def test_proxyless_server_endpoints(
    mode: MtlsMode, labels: dict[str, str], mtls: bool, tls_only: bool
) -> None:
    server = proxyless(SERVER_IP, "echo", **labels)
    idx = index(config(mode), server)
    [ep] = idx.endpoints(echo_service(), echo_service().ports[0])
    assert (ep.mtls, ep.tls_only) == (mtls, tls_only)
    # What the endpoint says is what the server's listener does (one rule, both sides).
    listeners = server_listeners(ctx_of(config(mode), server), server)
    assert (
        listeners[f"{grpc_listeners.SERVER_LISTENER_PREFIX}{SERVER_IP}:8080"]
        .filter_chains[0]
        .HasField("transport_socket")
        is tls_only
    )


def test_proxyless_without_provider_is_a_plain_endpoint() -> None:
    server = proxyless(SERVER_IP, "echo", provider=False)
    assert not server.cert_provider and not server.as_workload().proxyless
    [ep] = index(config(MtlsMode.STRICT), server).endpoints(echo_service(), echo_service().ports[0])
    assert (ep.mtls, ep.tls_only) == (False, False)


def test_envoy_sidecar_takes_only_mtls_under_strict() -> None:
    for mode, want in ((MtlsMode.STRICT, (True, True)), (MtlsMode.PERMISSIVE, (True, False))):
        [ep] = index(config(mode), envoy_sidecar(SERVER_IP, "echo")).endpoints(
            echo_service(), echo_service().ports[0]
        )
        assert (ep.mtls, ep.tls_only) == want


def test_metadata_names_the_certificate_provider() -> None:
    assert proxyless(SERVER_IP, "echo").cert_provider
    other = proxy_from_node(
        "sidecar~1.2.3.4~a.default~default.svc.cluster.local",
        {"GENERATOR": "grpc", "CERTIFICATE_PROVIDER": "something-else"},
    )
    assert not other.cert_provider


# --- clusters of a proxyless client ------------------------------------------------------------


def test_client_uses_mtls_towards_a_strict_proxyless_server() -> None:
    client, server = proxyless("127.0.5.9", "caller"), proxyless(SERVER_IP, "echo")
    ctx = ctx_of(config(MtlsMode.STRICT), client, server)
    tls = upstream(echo_cluster(ctx, client))
    assert tls is not None
    assert_providers(tls.common_tls_context, [ECHO_SAN])
    # gRPC reads nothing but common_tls_context; Envoy's SNI would be meaningless here.
    assert not tls.sni


def test_client_without_provider_gets_plaintext() -> None:
    # Naming a provider its bootstrap lacks would make gRPC reject the whole CDS response.
    client, server = proxyless("127.0.5.9", "caller", provider=False), proxyless(SERVER_IP, "echo")
    ctx = ctx_of(config(MtlsMode.STRICT), client, server)
    assert upstream(echo_cluster(ctx, client)) is None


@pytest.mark.parametrize("mode", [MtlsMode.PERMISSIVE, MtlsMode.DISABLE])
def test_plaintext_when_the_server_accepts_it(mode: MtlsMode) -> None:
    client, server = proxyless("127.0.5.9", "caller"), proxyless(SERVER_IP, "echo")
    assert upstream(echo_cluster(ctx_of(config(mode), client, server), client)) is None


def test_envoy_sidecars_permissive_is_plaintext_strict_is_mtls() -> None:
    # A PERMISSIVE sidecar's mTLS chain matches Istio's ALPN, which gRPC cannot offer.
    client, server = proxyless("127.0.5.9", "caller"), envoy_sidecar(SERVER_IP, "echo")
    assert (
        upstream(echo_cluster(ctx_of(config(MtlsMode.PERMISSIVE), client, server), client)) is None
    )
    assert upstream(echo_cluster(ctx_of(config(MtlsMode.STRICT), client, server), client))


def test_mixed_endpoints_are_plaintext_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    client, server = proxyless("127.0.5.9", "caller"), proxyless(SERVER_IP, "echo")
    cfg = config(MtlsMode.STRICT, entries=(plain_workload("echo-vm", "127.0.5.2", "echo"),))
    assert upstream(echo_cluster(ctx_of(cfg, client, server), client)) is None
    assert "1 of 2 endpoints accept plaintext" in caplog.text


def test_destination_rule_tls_wins() -> None:
    client, server = proxyless("127.0.5.9", "caller"), proxyless(SERVER_IP, "echo")

    def rule(mode: TlsMode) -> DestinationRule:
        return DestinationRule(
            "default",
            "echo",
            SourceRef("DestinationRule", "default", "echo"),
            host=ECHO,
            policy=TrafficPolicy(tls=ClientTls(mode)),
        )

    # DISABLE beats auto mTLS towards a STRICT server.
    cfg = config(MtlsMode.STRICT, rules=(rule(TlsMode.DISABLE),))
    assert upstream(echo_cluster(ctx_of(cfg, client, server), client)) is None
    # ISTIO_MUTUAL even where auto mTLS would say plaintext (PERMISSIVE server).
    cfg = config(MtlsMode.PERMISSIVE, rules=(rule(TlsMode.ISTIO_MUTUAL),))
    tls = upstream(echo_cluster(ctx_of(cfg, client, server), client))
    assert tls is not None
    # The SANs are those of the service's mTLS endpoints; this one takes plaintext: none.
    assert_providers(tls.common_tls_context, [])


def test_file_based_origination_stays_plaintext(caplog: pytest.LogCaptureFixture) -> None:
    client = proxyless("127.0.5.9", "caller")
    rule = DestinationRule(
        "default",
        "echo",
        SourceRef("DestinationRule", "default", "echo"),
        host=ECHO,
        policy=TrafficPolicy(tls=ClientTls(TlsMode.SIMPLE, ca_certificates="/etc/ca.pem")),
    )
    assert upstream(echo_cluster(ctx_of(config(rules=(rule,)), client), client)) is None
    assert "DestinationRule tls mode SIMPLE cannot be given to proxyless gRPC" in caplog.text


def test_mesh_external_is_plaintext() -> None:
    client = proxyless("127.0.5.9", "caller")
    external = Service(
        hostname="api.example.com",
        namespace="default",
        name="api",
        ports=(ServicePort("grpc", 443, Protocol.GRPC),),
        source=SourceRef("ServiceEntry", "default", "api"),
        registry="External",
        mesh_external=True,
    )
    clusters = decode_all(
        grpc_clusters.generate_clusters(
            ctx_of(config(MtlsMode.STRICT, extra=(external,)), client), client
        ),
        Cluster,
    )
    assert upstream(clusters["outbound|443||api.example.com"]) is None


def test_tls_and_plain_clients_get_separate_cache_slots() -> None:
    # Both kinds of client in one push: neither evicts the other's bytes (rule 8).
    capable, plain = proxyless("127.0.5.9", "caller"), proxyless("127.0.5.8", "old", provider=False)
    server = proxyless(SERVER_IP, "echo")
    cfg = config(MtlsMode.STRICT)
    cache = ResourceCache()
    for _ in range(2):
        ctx = GenContext(index(cfg, capable, plain, server), cache)
        a = grpc_clusters.generate_clusters(ctx, capable)[ECHO_CLUSTER]
        b = grpc_clusters.generate_clusters(ctx, plain)[ECHO_CLUSTER]
        assert a.any_bytes != b.any_bytes
    again = GenContext(index(cfg, capable, plain, server), cache)
    assert grpc_clusters.generate_clusters(again, capable)[ECHO_CLUSTER] is a


# --- listeners of a proxyless server -----------------------------------------------------------


def server_listeners(ctx: GenContext, server: Proxy) -> dict[str, Listener]:
    every = decode_all(grpc_listeners.generate_listeners(ctx, server), Listener)
    return {
        n: lis for n, lis in every.items() if n.startswith(grpc_listeners.SERVER_LISTENER_PREFIX)
    }


def test_server_listener_names_and_addresses() -> None:
    server = proxyless(SERVER_IP, "echo")
    listeners = server_listeners(ctx_of(config(MtlsMode.STRICT), server), server)
    want = {
        f"xds.istio.io/grpc/lds/inbound/{SERVER_IP}:8080": (SERVER_IP, 8080),
        "xds.istio.io/grpc/lds/inbound/0.0.0.0:8080": ("0.0.0.0", 8080),
        "xds.istio.io/grpc/lds/inbound/[::]:8080": ("::", 8080),
    }
    got = {
        n: (lis.address.socket_address.address, lis.address.socket_address.port_value)
        for n, lis in listeners.items()
    }
    assert got == want


def test_strict_server_listener_is_what_grpc_accepts() -> None:
    server = proxyless(SERVER_IP, "echo")
    listeners = server_listeners(ctx_of(config(MtlsMode.STRICT), server), server)
    listener = listeners[f"{grpc_listeners.SERVER_LISTENER_PREFIX}{SERVER_IP}:8080"]
    assert not listener.HasField("api_listener") and not listener.listener_filters
    assert not listener.HasField("use_original_dst")
    [chain] = listener.filter_chains
    assert not chain.HasField("filter_chain_match")
    [network_filter] = chain.filters
    hcm = unpack(network_filter.typed_config, HttpConnectionManager)
    assert [f.name for f in hcm.http_filters] == ["envoy.filters.http.router"]
    [vhost] = hcm.route_config.virtual_hosts
    [route] = vhost.routes
    assert route.WhichOneof("action") == "non_forwarding_action"
    tls = unpack(chain.transport_socket.typed_config, DownstreamTlsContext)
    assert tls.require_client_certificate.value
    assert not tls.HasField("require_sni")
    assert tls.ocsp_staple_policy == DownstreamTlsContext.LENIENT_STAPLING
    # gRPC rejects match_subject_alt_names on servers: no SANs here.
    assert_providers(tls.common_tls_context, [])


def test_port_level_mtls_and_disable() -> None:
    server = proxyless(SERVER_IP, "echo")
    policy = PeerAuthentication(
        "default",
        "echo",
        SourceRef("PeerAuthentication", "default", "echo"),
        selector=labels_of({"app": "echo"}),
        mode=MtlsMode.STRICT,
        port_modes=((8080, MtlsMode.DISABLE),),
    )
    cfg = MeshConfig(services=(echo_service(),), peer_authentications=(policy,))
    listener = server_listeners(ctx_of(cfg, server), server)[
        f"{grpc_listeners.SERVER_LISTENER_PREFIX}{SERVER_IP}:8080"
    ]
    [chain] = listener.filter_chains
    assert not chain.HasField("transport_socket")


def test_strict_without_provider_serves_nothing(caplog: pytest.LogCaptureFixture) -> None:
    server = proxyless(SERVER_IP, "echo", provider=False)
    assert server_listeners(ctx_of(config(MtlsMode.STRICT), server), server) == {}
    assert "is STRICT mTLS but the gRPC bootstrap has no" in caplog.text
    # PERMISSIVE without a provider: plaintext, served.
    assert server_listeners(ctx_of(config(MtlsMode.PERMISSIVE), server), server)


def test_a_workload_no_service_selects_gets_no_server_listener() -> None:
    lonely = proxyless(SERVER_IP, "lonely")
    assert server_listeners(ctx_of(config(MtlsMode.STRICT), lonely), lonely) == {}


def test_ipv6_listener_name_is_bracketed() -> None:
    assert (
        grpc_listeners.server_listener_name("fd00::5", 80)
        == "xds.istio.io/grpc/lds/inbound/[fd00::5]:80"
    )


# --- pushes ------------------------------------------------------------------------------------


def test_a_plaintext_endpoint_joining_mtls_ones_is_a_full_push() -> None:
    """gRPC decides TLS per cluster (CDS): when whether every endpoint takes only mTLS
    changes, an EDS-only push would leave clients on the wrong transport."""
    server = proxyless(SERVER_IP, "echo")
    other = proxyless("127.0.5.3", "echo")
    cfg = config(MtlsMode.STRICT)
    old = index(cfg, server)
    # Another mTLS-only endpoint of the same identity: EDS only.
    assert endpoints_only(old, old.next(cfg, [server.as_workload(), other.as_workload()]))
    # A plaintext one: the clusters change.
    vm = config(MtlsMode.STRICT, entries=(plain_workload("echo-vm", "127.0.5.2", "echo"),))
    plain = old.next(vm, [server.as_workload()])
    assert plain.changed_since(old) is not None
    assert not endpoints_only(old, plain)


# --- Envoy sidecars calling proxyless servers --------------------------------------------------


def test_envoy_offers_h2_alpn_towards_http2_ports_only() -> None:
    """A gRPC server refuses TLS without ALPN h2 negotiated; Istio's in-mesh ALPN for HTTP/2
    clusters has it, the one for other ports does not."""
    from control.generate import clusters

    web = kube_service("web", "default", ServicePort("http", 80, Protocol.HTTP))
    sidecar = envoy_sidecar("127.0.5.9", "caller")
    ctx = ctx_of(config(MtlsMode.STRICT, extra=(web,)), sidecar, proxyless(SERVER_IP, "echo"))
    out = decode_all(clusters.generate(ctx, sidecar), Cluster)

    def alpn(name: str) -> list[str]:
        match = next(m for m in out[name].transport_socket_matches if m.name == "tlsMode-istio")
        context = unpack(match.transport_socket.typed_config, UpstreamTlsContext)
        return list(context.common_tls_context.alpn_protocols)

    assert alpn(ECHO_CLUSTER) == ["istio-peer-exchange", "istio", "h2"]
    assert alpn("outbound|80||web.default.svc.cluster.local") == ["istio-peer-exchange", "istio"]


# --- AuthorizationPolicy on gRPC xDS servers (gRFC A41) ----------------------------------------


def authz(
    name: str, action: AuthzAction, *rules: AuthzRule, app: str | None = "echo"
) -> AuthorizationPolicy:
    return AuthorizationPolicy(
        "default",
        name,
        SourceRef("AuthorizationPolicy", "default", name),
        selector=labels_of({"app": app}) if app else None,
        action=action,
        rules=rules,
    )


def server_rbac(policies: tuple[AuthorizationPolicy, ...]) -> list[HttpRBAC]:
    """The RBAC filters of the echo server's listener at its pod IP, checking their place."""
    server = proxyless(SERVER_IP, "echo")
    cfg = replace(config(MtlsMode.STRICT), authorization_policies=policies)
    listener = server_listeners(ctx_of(cfg, server), server)[
        f"{grpc_listeners.SERVER_LISTENER_PREFIX}{SERVER_IP}:8080"
    ]
    [chain] = listener.filter_chains
    hcm = unpack(chain.filters[0].typed_config, HttpConnectionManager)
    names = [f.name for f in hcm.http_filters]
    assert names[-1] == "envoy.filters.http.router"
    # gRPC refuses a listener with two filters of one name.
    assert len(set(names)) == len(names)
    assert all(n.startswith("envoy.filters.http.rbac.") for n in names[:-1])
    return [unpack(f.typed_config, HttpRBAC) for f in hcm.http_filters[:-1]]


CALLER = AuthzSource(principals=("cluster.local/ns/default/sa/caller",))
SECRET = AuthzOperation(paths=("/test.Echo/Secret",))


def test_server_listener_carries_deny_then_allow_rbac() -> None:
    filters = server_rbac(
        (
            authz("allow-caller", AuthzAction.ALLOW, AuthzRule(sources=(CALLER,))),
            authz("no-secret", AuthzAction.DENY, AuthzRule(operations=(SECRET,))),
        )
    )
    assert [f.rules.action for f in filters] == [RBAC.DENY, RBAC.ALLOW]
    [deny] = filters[0].rules.policies.values()
    assert deny.permissions[0].url_path.path.exact == "/test.Echo/Secret"
    [allow] = filters[1].rules.policies.values()
    principal = allow.principals[0].authenticated.principal_name
    assert principal.exact == "spiffe://cluster.local/ns/default/sa/caller"


def test_server_without_policies_or_selected_by_none_has_only_the_router() -> None:
    assert server_rbac(()) == []
    other = authz("other", AuthzAction.ALLOW, AuthzRule(sources=(CALLER,)), app="other")
    assert server_rbac((other,)) == []


def test_allow_policy_without_rules_denies_everything() -> None:
    [allow] = server_rbac((authz("nothing", AuthzAction.ALLOW),))
    assert allow.rules.action == RBAC.ALLOW and not allow.rules.policies


def test_policy_change_rebuilds_the_server_listener() -> None:
    server = proxyless(SERVER_IP, "echo")
    cache = ResourceCache()
    name = f"{grpc_listeners.SERVER_LISTENER_PREFIX}{SERVER_IP}:8080"
    versions = []
    for policies in ((), (authz("a", AuthzAction.ALLOW, AuthzRule(sources=(CALLER,))),), ()):
        cfg = replace(config(MtlsMode.STRICT), authorization_policies=policies)
        ctx = GenContext(index(cfg, server), cache)
        versions.append(grpc_listeners.generate_listeners(ctx, server)[name].version)
    assert versions[0] != versions[1] and versions[0] == versions[2]


# What gRPC's RBAC filter evaluates (gRFC A41); anything else makes it reject the listener.
GRPC_PERMISSIONS = {
    "and_rules", "or_rules", "any", "header", "url_path", "destination_ip",
    "destination_port", "not_rule",
}  # fmt: skip
GRPC_PRINCIPALS = {
    "and_ids", "or_ids", "any", "authenticated", "source_ip", "direct_remote_ip",
    "remote_ip", "header", "url_path", "not_id",
}  # fmt: skip


def _kinds(msg: Permission | Principal, out: set[str]) -> set[str]:
    field = msg.WhichOneof("rule" if isinstance(msg, Permission) else "identifier")
    assert field is not None
    out.add(field)
    value = getattr(msg, field)
    if field in ("and_rules", "or_rules"):
        for r in value.rules:
            _kinds(r, out)
    elif field in ("and_ids", "or_ids"):
        for i in value.ids:
            _kinds(i, out)
    elif field in ("not_rule", "not_id"):
        _kinds(value, out)
    return out


def test_every_matcher_is_one_grpc_evaluates() -> None:
    every_field = AuthzRule(
        sources=(
            AuthzSource(
                principals=("cluster.local/ns/default/sa/caller", "*/sa/x", "*"),
                not_principals=("cluster.local/ns/default/sa/bad",),
                namespaces=("default", "ops-*"),
                not_namespaces=("*-test",),
            ),
        ),
        operations=(
            AuthzOperation(
                paths=("/test.Echo/*", "*/Who"),
                not_paths=("/test.Echo/Secret",),
                methods=("POST",),
                not_methods=("GET",),
                ports=(8080,),
                not_ports=(9090,),
            ),
        ),
    )
    filters = server_rbac(
        (
            authz("allow", AuthzAction.ALLOW, every_field),
            authz("deny", AuthzAction.DENY, every_field),
        )
    )
    permissions: set[str] = set()
    principals: set[str] = set()
    for f in filters:
        for policy in f.rules.policies.values():
            for perm in policy.permissions:
                _kinds(perm, permissions)
            for principal in policy.principals:
                _kinds(principal, principals)
    assert permissions <= GRPC_PERMISSIONS and principals <= GRPC_PRINCIPALS
    assert {"url_path", "destination_port", "not_rule"} <= permissions
    assert {"authenticated", "not_id"} <= principals
