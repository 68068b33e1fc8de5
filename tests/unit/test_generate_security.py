"""Security in generated sidecar config: which policies apply to a workload (MeshIndex), auto
mTLS on clusters and endpoints, inbound listeners per PeerAuthentication, and RBAC compiled
from AuthorizationPolicy."""

from __future__ import annotations

from typing import Any, TypeVar

import pytest
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.rbac.v3.rbac_pb2 import RBAC
from envoy.extensions.filters.http.rbac.v3.rbac_pb2 import RBAC as HttpRBAC
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)
from envoy.extensions.filters.network.rbac.v3.rbac_pb2 import RBAC as NetworkRBAC
from envoy.extensions.transport_sockets.tls.v3.common_pb2 import SubjectAltNameMatcher
from envoy.extensions.transport_sockets.tls.v3.tls_pb2 import (
    DownstreamTlsContext,
    UpstreamTlsContext,
)
from google.protobuf import any_pb2, json_format
from google.protobuf.message import Message

from control.generate import GENERATORS, authz_rbac
from control.generate.context import GenContext
from control.generate.resource_names import CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE
from control.model.index import MeshIndex
from control.model.proxy import Proxy, proxy_from_node
from control.model.types import (
    AuthorizationPolicy,
    AuthzAction,
    AuthzOperation,
    AuthzRule,
    AuthzSource,
    IngressListener,
    MeshConfig,
    MtlsMode,
    PeerAuthentication,
    PeerPolicy,
    Protocol,
    Resolution,
    Service,
    ServicePort,
    SidecarPort,
    SidecarScope,
    SourceRef,
    Workload,
    WorkloadEndpointSpec,
    labels_of,
)
from control.xds.cache import ResourceCache

M = TypeVar("M", bound=Message)
WEB_HOST = "web.shop.svc.cluster.local"


def unpack(data: bytes | any_pb2.Any, cls: type[M]) -> M:
    wrapped = data if isinstance(data, any_pb2.Any) else any_pb2.Any.FromString(data)
    msg = cls()
    assert wrapped.Unpack(msg)
    return msg


def pa(ns: str, name: str, mode: MtlsMode = MtlsMode.UNSET, **kw: Any) -> PeerAuthentication:
    return PeerAuthentication(ns, name, SourceRef("PeerAuthentication", ns, name), mode=mode, **kw)


def ap(
    ns: str,
    name: str,
    action: AuthzAction,
    *rules: AuthzRule,
    selector: dict[str, str] | None = None,
) -> AuthorizationPolicy:
    return AuthorizationPolicy(
        ns,
        name,
        SourceRef("AuthorizationPolicy", ns, name),
        selector=labels_of(selector) if selector is not None else None,
        action=action,
        rules=rules,
    )


def web_service() -> Service:
    return Service(
        hostname=WEB_HOST,
        namespace="shop",
        name="web",
        ports=(
            ServicePort("http", 9080, Protocol.HTTP, 8080),
            ServicePort("tcp-db", 5432, Protocol.TCP),
        ),
        source=SourceRef("Service", "shop", "web"),
        selector=labels_of({"app": "web"}),
    )


def entry(name: str, address: str, account: str, **labels: str) -> Workload:
    return Workload(
        name=name,
        namespace="shop",
        address=address,
        labels=labels_of({"app": "web", **labels}),
        service_account=account,
        source=SourceRef("WorkloadEntry", "shop", name),
        has_sidecar=labels.get("security.istio.io/tlsMode") == "istio",
    )


def proxy(ip: str, name: str, ns: str = "shop", *, sds: bool = True, **labels: str) -> Proxy:
    meta: dict[str, Any] = {"LABELS": labels, "SERVICE_ACCOUNT": name}
    if sds:
        meta["SDS"] = "true"
    return proxy_from_node(f"sidecar~{ip}~{name}.{ns}~{ns}.svc.cluster.local", meta)


SERVER_SIDECAR = SidecarScope(
    "shop",
    "web",
    SourceRef("Sidecar", "shop", "web"),
    workload_selector=labels_of({"app": "web"}),
    ingress=(
        IngressListener(SidecarPort(8080, Protocol.HTTP), default_endpoint="127.0.0.1:18080"),
        IngressListener(SidecarPort(5432, Protocol.TCP), default_endpoint="127.0.0.1:15432"),
    ),
)


def generate(config: MeshConfig, p: Proxy, *others: Proxy) -> dict[str, dict[str, Message]]:
    ctx = GenContext(MeshIndex(config, [x.as_workload() for x in (p, *others)]), ResourceCache())
    classes = {CLUSTER_TYPE: Cluster, ENDPOINT_TYPE: ClusterLoadAssignment, LISTENER_TYPE: Listener}
    return {
        t: {n: unpack(r.any_bytes, cls) for n, r in GENERATORS[t](ctx, p).items()}
        for t, cls in classes.items()
    }


# --- policy selection ------------------------------------------------------------------------


def test_peer_policy_inherits_workload_namespace_mesh() -> None:
    config = MeshConfig(
        peer_authentications=(
            pa("istio-system", "default", MtlsMode.STRICT),
            pa("shop", "ns", MtlsMode.UNSET),
            pa("legacy", "ns", MtlsMode.DISABLE),
            pa(
                "shop",
                "web",
                MtlsMode.PERMISSIVE,
                selector=labels_of({"app": "web"}),
                port_modes=((8080, MtlsMode.DISABLE), (9090, MtlsMode.UNSET)),
            ),
            pa("shop", "z-other", MtlsMode.DISABLE, selector=labels_of({"app": "web"})),
        )
    )
    index = MeshIndex(config)
    web = labels_of({"app": "web", "v": "1"})
    # Workload level wins (first by name of two matching), with its ports; UNSET inherits.
    assert index.peer_policy("shop", web) == PeerPolicy(
        MtlsMode.PERMISSIVE, ((8080, MtlsMode.DISABLE), (9090, MtlsMode.PERMISSIVE))
    )
    assert index.peer_policy("shop", web).mode_for(8080) is MtlsMode.DISABLE
    assert index.peer_policy("shop", web).mode_for(7000) is MtlsMode.PERMISSIVE
    # Namespace policy UNSET: the mesh's STRICT shows through.
    assert index.peer_policy("shop", labels_of({"app": "db"})) == PeerPolicy(MtlsMode.STRICT)
    assert index.peer_policy("legacy", ()) == PeerPolicy(MtlsMode.DISABLE)
    assert index.peer_policy("other", ()) == PeerPolicy(MtlsMode.STRICT)
    # Nothing configured anywhere: Istio's default.
    assert MeshIndex(MeshConfig()).peer_policy("x", ()) == PeerPolicy(MtlsMode.PERMISSIVE)


def test_authorization_policies_for_workload() -> None:
    mesh_wide = ap("istio-system", "mesh", AuthzAction.DENY)
    mesh_web = ap("istio-system", "mesh-web", AuthzAction.ALLOW, selector={"app": "web"})
    ns_wide = ap("shop", "all", AuthzAction.ALLOW)
    web = ap("shop", "web", AuthzAction.ALLOW, selector={"app": "web"})
    db = ap("shop", "db", AuthzAction.ALLOW, selector={"app": "db"})
    elsewhere = ap("other", "web", AuthzAction.ALLOW, selector={"app": "web"})
    index = MeshIndex(
        MeshConfig(authorization_policies=(web, db, elsewhere, ns_wide, mesh_web, mesh_wide))
    )
    assert index.authorization_policies("shop", labels_of({"app": "web"})) == (
        mesh_wide,
        mesh_web,
        ns_wide,
        web,
    )
    assert index.authorization_policies("shop", labels_of({"app": "db"})) == (
        mesh_wide,
        ns_wide,
        db,
    )
    assert index.authorization_policies("third", labels_of({"app": "web"})) == (
        mesh_wide,
        mesh_web,
    )


# --- auto mTLS, outbound ---------------------------------------------------------------------


def mtls_mesh(**kw: Any) -> MeshConfig:
    return MeshConfig(
        services=(
            web_service(),
            Service(
                hostname="api.example.com",
                namespace="shop",
                name="api",
                ports=(ServicePort("http", 80, Protocol.HTTP),),
                source=SourceRef("ServiceEntry", "shop", "api"),
                registry="External",
                mesh_external=True,
                resolution=Resolution.STATIC,
                static_endpoints=(
                    WorkloadEndpointSpec(
                        "10.9.0.1", labels=labels_of({"security.istio.io/tlsMode": "istio"})
                    ),
                ),
            ),
        ),
        workload_entries=(
            entry("vm-1", "10.0.0.1", "vm", **{"security.istio.io/tlsMode": "istio"}),
            entry("vm-2", "10.0.0.2", "legacy"),  # no sidecar: plaintext
        ),
        sidecars=(SERVER_SIDECAR,),
        **kw,
    )


def test_auto_mtls_cluster_and_endpoints() -> None:
    client = proxy("127.0.1.1", "client", app="client")
    server = proxy("127.0.1.2", "web-pod", app="web")
    out = generate(mtls_mesh(), client, server)
    cluster = out[CLUSTER_TYPE][f"outbound|9080||{WEB_HOST}"]
    assert isinstance(cluster, Cluster)
    assert not cluster.HasField("transport_socket")
    mtls, plain = cluster.transport_socket_matches
    assert (mtls.name, json_format.MessageToDict(mtls.match)) == (
        "tlsMode-istio",
        {"tlsMode": "istio"},
    )
    assert (plain.name, plain.transport_socket.name) == (
        "tlsMode-disabled",
        "envoy.transport_sockets.raw_buffer",
    )
    assert json_format.MessageToDict(plain.match) == {}
    tls = unpack(mtls.transport_socket.typed_config, UpstreamTlsContext)
    assert mtls.transport_socket.name == "envoy.transport_sockets.tls"
    assert tls.sni == f"outbound_.9080_._.{WEB_HOST}"
    common = tls.common_tls_context
    assert list(common.alpn_protocols) == ["istio-peer-exchange", "istio"]
    (cert,) = common.tls_certificate_sds_secret_configs
    root = common.combined_validation_context.validation_context_sds_secret_config
    assert (cert.name, root.name) == ("default", "ROOTCA")
    for secret in (cert, root):
        source = secret.sds_config.api_config_source
        (grpc_service,) = source.grpc_services
        assert grpc_service.envoy_grpc.cluster_name == "sds-grpc"
        assert not secret.sds_config.HasField("ads")
    sans = common.combined_validation_context.default_validation_context
    # The SPIFFE IDs of the endpoints with a sidecar: the VM and the connected proxy.
    assert [(m.san_type, m.matcher.exact) for m in sans.match_typed_subject_alt_names] == [
        (SubjectAltNameMatcher.URI, "spiffe://cluster.local/ns/shop/sa/vm"),
        (SubjectAltNameMatcher.URI, "spiffe://cluster.local/ns/shop/sa/web-pod"),
    ]
    cla = out[ENDPOINT_TYPE][f"outbound|9080||{WEB_HOST}"]
    assert isinstance(cla, ClusterLoadAssignment)
    labelled = {
        e.endpoint.address.socket_address.address: json_format.MessageToDict(e.metadata)
        for group in cla.endpoints
        for e in group.lb_endpoints
    }
    assert labelled == {
        "10.0.0.1": {"filterMetadata": {"envoy.transport_socket_match": {"tlsMode": "istio"}}},
        "10.0.0.2": {},
        "127.0.1.2": {"filterMetadata": {"envoy.transport_socket_match": {"tlsMode": "istio"}}},
    }
    # Outside the mesh: plaintext even if an endpoint claims a sidecar.
    external = out[CLUSTER_TYPE]["outbound|80||api.example.com"]
    assert isinstance(external, Cluster)
    assert not external.transport_socket_matches


def test_proxy_without_sds_stays_plaintext_and_is_reached_plaintext() -> None:
    client = proxy("127.0.1.1", "client", sds=False, app="client")
    server = proxy("127.0.1.2", "web-pod", sds=False, app="web")
    out = generate(mtls_mesh(), client, server)
    assert not any(c.transport_socket_matches for c in out[CLUSTER_TYPE].values())  # type: ignore[attr-defined]
    cla = out[ENDPOINT_TYPE][f"outbound|9080||{WEB_HOST}"]
    assert isinstance(cla, ClusterLoadAssignment)
    tls_endpoints = [
        e.endpoint.address.socket_address.address
        for group in cla.endpoints
        for e in group.lb_endpoints
        if e.metadata.filter_metadata
    ]
    assert tls_endpoints == ["10.0.0.1"]  # the labelled VM only; the proxy has no certificate


def test_endpoint_whose_policy_disables_mtls_is_plaintext() -> None:
    config = mtls_mesh(
        peer_authentications=(
            pa("shop", "vm", MtlsMode.DISABLE, selector=labels_of({"app": "web"})),
        )
    )
    out = generate(config, proxy("127.0.1.1", "client", app="client"))
    cla = out[ENDPOINT_TYPE][f"outbound|9080||{WEB_HOST}"]
    assert isinstance(cla, ClusterLoadAssignment)
    assert not any(e.metadata.filter_metadata for g in cla.endpoints for e in g.lb_endpoints)
    cluster = out[CLUSTER_TYPE][f"outbound|9080||{WEB_HOST}"]
    assert isinstance(cluster, Cluster)
    tls = unpack(
        cluster.transport_socket_matches[0].transport_socket.typed_config, UpstreamTlsContext
    )
    validation = tls.common_tls_context.combined_validation_context.default_validation_context
    assert not validation.match_typed_subject_alt_names  # no mTLS endpoint: no identity


def test_plain_and_mtls_proxies_share_bytes_without_evicting() -> None:
    config = mtls_mesh()
    cache = ResourceCache()
    plain = proxy("127.0.1.1", "a", sds=False, app="client")
    mtls = proxy("127.0.1.3", "b", app="client")
    for _ in range(2):
        ctx = GenContext(MeshIndex(config), cache)
        before = cache.serializations
        first = GENERATORS[CLUSTER_TYPE](ctx, plain)
        second = GENERATORS[CLUSTER_TYPE](ctx, mtls)
        name = f"outbound|9080||{WEB_HOST}"
        assert first[name].version != second[name].version
    assert cache.serializations == before  # second round: all from the cache


# --- inbound per PeerAuthentication ----------------------------------------------------------


def inbound(out: dict[str, dict[str, Message]], port: int) -> Listener:
    listener = out[LISTENER_TYPE][f"127.0.1.2_{port}"]
    assert isinstance(listener, Listener)
    return listener


def hcm_of(chain: Any) -> HttpConnectionManager:
    (f,) = chain.filters
    return unpack(f.typed_config, HttpConnectionManager)


@pytest.mark.parametrize("mode", [MtlsMode.STRICT, MtlsMode.PERMISSIVE, MtlsMode.DISABLE])
def test_inbound_chains_follow_peer_authentication(mode: MtlsMode) -> None:
    config = mtls_mesh(peer_authentications=(pa("shop", "default", mode),))
    server = proxy("127.0.1.2", "web-pod", app="web")
    listener = inbound(generate(config, server), 8080)
    names = [c.name for c in listener.filter_chains]
    inspector = [f.name for f in listener.listener_filters]
    if mode is MtlsMode.STRICT:
        assert names == ["mtls"] and inspector == []
        assert not listener.filter_chains[0].HasField("filter_chain_match")
    elif mode is MtlsMode.PERMISSIVE:
        assert names == ["mtls", "plaintext"]
        assert inspector == ["envoy.filters.listener.tls_inspector"]
        match = listener.filter_chains[0].filter_chain_match
        assert match.transport_protocol == "tls"
        assert "istio" in match.application_protocols
    else:
        assert names == ["plaintext"] and inspector == []
    for chain in listener.filter_chains:
        hcm = hcm_of(chain)
        if chain.name == "mtls":
            tls = unpack(chain.transport_socket.typed_config, DownstreamTlsContext)
            assert tls.require_client_certificate.value is True
            common = tls.common_tls_context
            assert common.tls_certificate_sds_secret_configs[0].name == "default"
            root = common.combined_validation_context.validation_context_sds_secret_config
            assert root.name == "ROOTCA"
            assert hcm.forward_client_cert_details == HttpConnectionManager.SANITIZE_SET
            assert hcm.set_current_client_cert_details.uri is True
        else:
            assert not chain.HasField("transport_socket")
            # Default SANITIZE: a plaintext caller cannot hand the app a forged identity.
            assert hcm.forward_client_cert_details == HttpConnectionManager.SANITIZE


def test_default_is_permissive_and_port_level_wins() -> None:
    config = mtls_mesh(
        peer_authentications=(
            pa(
                "shop",
                "web",
                selector=labels_of({"app": "web"}),
                port_modes=((5432, MtlsMode.STRICT),),
            ),
        )
    )
    out = generate(config, proxy("127.0.1.2", "web-pod", app="web"))
    assert [c.name for c in inbound(out, 8080).filter_chains] == ["mtls", "plaintext"]
    tcp = inbound(out, 5432)
    assert [c.name for c in tcp.filter_chains] == ["mtls"]
    assert tcp.filter_chains[0].filters[-1].name == "envoy.filters.network.tcp_proxy"


def test_strict_without_sds_serves_nothing(caplog: pytest.LogCaptureFixture) -> None:
    config = mtls_mesh(peer_authentications=(pa("istio-system", "default", MtlsMode.STRICT),))
    out = generate(config, proxy("127.0.1.2", "web-pod", sds=False, app="web"))
    assert "127.0.1.2_8080" not in out[LISTENER_TYPE]
    assert "is STRICT mTLS but the proxy has no SDS" in caplog.text
    # PERMISSIVE without SDS: plaintext only, as before security existed.
    out = generate(mtls_mesh(), proxy("127.0.1.2", "web-pod", sds=False, app="web"))
    assert [c.name for c in inbound(out, 8080).filter_chains] == ["plaintext"]


# --- RBAC ------------------------------------------------------------------------------------


def http_rbac(listener: Listener) -> list[tuple[str, RBAC]]:
    out = []
    for f in hcm_of(listener.filter_chains[-1]).http_filters:
        if f.name == "envoy.filters.http.rbac":
            out.append((f.name, unpack(f.typed_config, HttpRBAC).rules))
    return out


def as_dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message)


def test_rbac_deny_before_allow_and_router_last() -> None:
    config = mtls_mesh(
        authorization_policies=(
            ap(
                "shop",
                "allow-client",
                AuthzAction.ALLOW,
                AuthzRule(sources=(AuthzSource(principals=("cluster.local/ns/shop/sa/client",)),)),
                selector={"app": "web"},
            ),
            ap(
                "shop",
                "deny-admin",
                AuthzAction.DENY,
                AuthzRule(operations=(AuthzOperation(paths=("/admin*",), methods=("POST",)),)),
            ),
        )
    )
    listener = inbound(generate(config, proxy("127.0.1.2", "web-pod", app="web")), 8080)
    for chain in listener.filter_chains:
        names = [f.name for f in hcm_of(chain).http_filters]
        assert names == [
            "envoy.filters.http.rbac",
            "envoy.filters.http.rbac",
            "envoy.filters.http.router",
        ]
    (_, deny), (_, allow) = http_rbac(listener)
    assert deny.action == RBAC.DENY and allow.action == RBAC.ALLOW
    assert as_dict(deny.policies["ns[shop]-policy[deny-admin]-rule[0]"]) == {
        "permissions": [
            {
                "andRules": {
                    "rules": [
                        {"urlPath": {"path": {"prefix": "/admin"}}},
                        {"header": {"name": ":method", "stringMatch": {"exact": "POST"}}},
                    ]
                }
            }
        ],
        "principals": [{"any": True}],
    }
    assert as_dict(allow.policies["ns[shop]-policy[allow-client]-rule[0]"]) == {
        "permissions": [{"any": True}],
        "principals": [
            {
                "authenticated": {
                    "principalName": {"exact": "spiffe://cluster.local/ns/shop/sa/client"}
                }
            }
        ],
    }


def rules_of(policy: AuthorizationPolicy, *, http: bool = True) -> dict[str, Any]:
    ((_, config),) = authz_rbac.rbac_configs((policy,), http=http)
    return {name: as_dict(p) for name, p in config.policies.items()}


def test_rbac_values_and_wildcards() -> None:
    policy = ap(
        "shop",
        "p",
        AuthzAction.ALLOW,
        AuthzRule(
            sources=(
                AuthzSource(
                    principals=("*", "cluster.local/ns/shop/*", "*/sa/admin"),
                    namespaces=("shop", "team-*"),
                    not_namespaces=("*-test",),
                ),
            ),
            operations=(
                AuthzOperation(paths=("*.php", "*"), ports=(8080, 9090), not_methods=("DELETE",)),
            ),
        ),
    )
    ((name, compiled),) = rules_of(policy).items()
    assert name == "ns[shop]-policy[p]-rule[0]"
    seg = "[^/]+"
    assert compiled == {
        "permissions": [
            {
                "andRules": {
                    "rules": [
                        {
                            "orRules": {
                                "rules": [{"urlPath": {"path": {"suffix": ".php"}}}, {"any": True}]
                            }
                        },
                        {
                            "notRule": {
                                "header": {"name": ":method", "stringMatch": {"exact": "DELETE"}}
                            }
                        },
                        {
                            "orRules": {
                                "rules": [{"destinationPort": 8080}, {"destinationPort": 9090}]
                            }
                        },
                    ]
                }
            }
        ],
        "principals": [
            {
                "andIds": {
                    "ids": [
                        {
                            "orIds": {
                                "ids": [
                                    {
                                        "authenticated": {
                                            "principalName": {"safeRegex": {"regex": ".+"}}
                                        }
                                    },
                                    {
                                        "authenticated": {
                                            "principalName": {
                                                "prefix": "spiffe://cluster.local/ns/shop/"
                                            }
                                        }
                                    },
                                    {"authenticated": {"principalName": {"suffix": "/sa/admin"}}},
                                ]
                            }
                        },
                        {
                            "orIds": {
                                "ids": [
                                    {
                                        "authenticated": {
                                            "principalName": {
                                                "safeRegex": {
                                                    "regex": f"spiffe://{seg}/ns/shop/sa/{seg}"
                                                }
                                            }
                                        }
                                    },
                                    {
                                        "authenticated": {
                                            "principalName": {
                                                "safeRegex": {
                                                    "regex": f"spiffe://{seg}/ns/team\\-[^/]*/sa/{seg}"
                                                }
                                            }
                                        }
                                    },
                                ]
                            }
                        },
                        {
                            "notId": {
                                "authenticated": {
                                    "principalName": {
                                        "safeRegex": {
                                            "regex": f"spiffe://{seg}/ns/[^/]*\\-test/sa/{seg}"
                                        }
                                    }
                                }
                            }
                        },
                    ]
                }
            }
        ],
    }


def test_empty_rule_semantics() -> None:
    nothing = ap("shop", "nothing", AuthzAction.ALLOW)
    everything = ap("shop", "all", AuthzAction.ALLOW, AuthzRule())
    deny_nothing = ap("shop", "dn", AuthzAction.DENY)
    # ALLOW without rules: an ALLOW filter with no policies refuses every request.
    ((action, config),) = authz_rbac.rbac_configs((nothing,), http=True)
    assert action is AuthzAction.ALLOW and config.action == RBAC.ALLOW and not config.policies
    assert rules_of(everything) == {
        "ns[shop]-policy[all]-rule[0]": {
            "permissions": [{"any": True}],
            "principals": [{"any": True}],
        }
    }
    assert authz_rbac.rbac_configs((deny_nothing,), http=True) == []  # denies nothing: no filter
    assert authz_rbac.rbac_configs((), http=True) == []  # no policy: no filter, all allowed


def test_unsupported_rules_fail_closed() -> None:
    allow = ap("shop", "a", AuthzAction.ALLOW, AuthzRule(unsupported=True))
    deny = ap("shop", "d", AuthzAction.DENY, AuthzRule(unsupported=True))
    assert rules_of(allow) == {}  # never matches: with no other rule, nothing is allowed
    assert rules_of(deny) == {
        "ns[shop]-policy[d]-rule[0]": {
            "permissions": [{"any": True}],
            "principals": [{"any": True}],
        }
    }


def test_tcp_ports_drop_or_strip_http_fields() -> None:
    http_only = AuthzOperation(paths=("/x",))
    with_port = AuthzOperation(methods=("GET",), ports=(5432,))
    allow = ap("shop", "a", AuthzAction.ALLOW, AuthzRule(operations=(http_only,)))
    allow_mixed = ap(
        "shop",
        "m",
        AuthzAction.ALLOW,
        AuthzRule(operations=(http_only, AuthzOperation(ports=(5432,)))),
    )
    deny = ap("shop", "d", AuthzAction.DENY, AuthzRule(operations=(with_port,)))
    # ALLOW: an operation that needs HTTP can never match a TCP connection.
    assert rules_of(allow, http=False) == {}
    assert rules_of(allow_mixed, http=False) == {
        "ns[shop]-policy[m]-rule[0]": {
            "permissions": [{"destinationPort": 5432}],
            "principals": [{"any": True}],
        }
    }
    # DENY: the HTTP fields go, the rule denies the whole port.
    assert rules_of(deny, http=False) == {
        "ns[shop]-policy[d]-rule[0]": {
            "permissions": [{"destinationPort": 5432}],
            "principals": [{"any": True}],
        }
    }


def test_tcp_listener_gets_network_rbac_before_tcp_proxy() -> None:
    config = mtls_mesh(
        authorization_policies=(
            ap(
                "shop",
                "ns-only",
                AuthzAction.ALLOW,
                AuthzRule(sources=(AuthzSource(namespaces=("shop",)),)),
            ),
        )
    )
    listener = inbound(generate(config, proxy("127.0.1.2", "web-pod", app="web")), 5432)
    for chain in listener.filter_chains:
        first, last = chain.filters
        assert (first.name, last.name) == (
            "envoy.filters.network.rbac",
            "envoy.filters.network.tcp_proxy",
        )
        config_ = unpack(first.typed_config, NetworkRBAC)
        assert config_.rules.action == RBAC.ALLOW
        assert config_.stat_prefix == "inbound_127.0.1.2_5432.allow"
        assert list(config_.rules.policies) == ["ns[shop]-policy[ns-only]-rule[0]"]
