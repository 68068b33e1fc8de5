"""Real Envoy accepts the generated security config: auto mTLS clusters, inbound listeners
under STRICT, PERMISSIVE and DISABLE, and RBAC filters from AuthorizationPolicies.

The resources are folded into a static bootstrap as in test_generate_envoy_validate.py, plus
the `sds-grpc` cluster an agent's bootstrap declares (Envoy refuses SDS references to an
unknown cluster, which this also checks)."""

from __future__ import annotations

from pathlib import Path

import pytest
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.core.v3.address_pb2 import Address, Pipe
from envoy.config.core.v3.base_pb2 import TrafficDirection
from envoy.config.endpoint.v3.endpoint_components_pb2 import (
    Endpoint,
    LbEndpoint,
    LocalityLbEndpoints,
)
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.extensions.upstreams.http.v3.http_protocol_options_pb2 import HttpProtocolOptions

from control.generate import GENERATORS, authz_rbac
from control.generate.context import GenContext
from control.generate.mesh_tls import SDS_CLUSTER
from control.generate.resource_names import CLUSTER_TYPE, LISTENER_TYPE
from control.generate.wire import pack
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
    Protocol,
    ServicePort,
    SidecarPort,
    SidecarScope,
    SourceRef,
    labels_of,
)
from control.xds.cache import ResourceCache
from tests.integration.test_generate_envoy_validate import (
    kube,
    mesh,
    static_bootstrap,
    unpack,
    validate,
    workload,
)

pytestmark = pytest.mark.envoy


def sds_cluster(path: Path) -> Cluster:
    options = HttpProtocolOptions()
    options.explicit_http_config.http2_protocol_options.SetInParent()
    cluster = Cluster(name=SDS_CLUSTER, type=Cluster.STATIC)
    cluster.connect_timeout.seconds = 1
    cluster.typed_extension_protocol_options[
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ].CopyFrom(pack(options))
    cluster.load_assignment.CopyFrom(
        ClusterLoadAssignment(
            cluster_name=SDS_CLUSTER,
            endpoints=[
                LocalityLbEndpoints(
                    lb_endpoints=[
                        LbEndpoint(endpoint=Endpoint(address=Address(pipe=Pipe(path=str(path)))))
                    ]
                )
            ],
        )
    )
    return cluster


def policy(
    name: str, action: AuthzAction, *rules: AuthzRule, ns: str = "default"
) -> AuthorizationPolicy:
    return AuthorizationPolicy(
        namespace=ns,
        name=name,
        source=SourceRef("AuthorizationPolicy", ns, name),
        selector=labels_of({"app": "client"}),
        action=action,
        rules=rules,
    )


RULES = (
    policy(
        "deny-admin",
        AuthzAction.DENY,
        AuthzRule(
            operations=(AuthzOperation(paths=("/admin*", "*.php"), methods=("POST", "DELETE")),),
        ),
        AuthzRule(sources=(AuthzSource(not_namespaces=("default", "shop*")),)),
    ),
    policy(
        "allow-callers",
        AuthzAction.ALLOW,
        AuthzRule(
            sources=(
                AuthzSource(principals=("cluster.local/ns/default/sa/web", "*/sa/admin")),
                AuthzSource(namespaces=("*", "*-prod"), not_principals=("*",)),
            ),
            operations=(
                AuthzOperation(ports=(8000, 3306), not_paths=("/private",)),
                AuthzOperation(methods=("GET",), not_ports=(7000,), not_methods=("*",)),
            ),
        ),
        AuthzRule(),
    ),
    policy("allow-nothing", AuthzAction.ALLOW),
)


def secured_mesh(mode: MtlsMode, with_rbac: bool) -> MeshConfig:
    base = mesh()
    return MeshConfig(
        services=base.services,
        workload_entries=base.workload_entries,
        sidecars=base.sidecars,
        peer_authentications=(
            PeerAuthentication(
                "istio-system", "default", SourceRef("PeerAuthentication", "", ""), mode=mode
            ),
            PeerAuthentication(
                "default",
                "client-ports",
                SourceRef("PeerAuthentication", "", ""),
                selector=labels_of({"app": "client"}),
                port_modes=((8000, MtlsMode.DISABLE), (3306, MtlsMode.STRICT)),
            ),
        ),
        authorization_policies=RULES if with_rbac else (),
    )


def client() -> Proxy:
    return proxy_from_node(
        "sidecar~127.0.1.1~client.default~default.svc.cluster.local",
        {"LABELS": {"app": "client"}, "SDS": "true", "SERVICE_ACCOUNT": "client"},
    )


@pytest.mark.parametrize(
    ("mode", "with_rbac"),
    [
        (MtlsMode.STRICT, False),
        (MtlsMode.PERMISSIVE, False),
        (MtlsMode.DISABLE, False),
        (MtlsMode.PERMISSIVE, True),
        (MtlsMode.STRICT, True),
    ],
)
def test_envoy_accepts_security_config(tmp_path: Path, mode: MtlsMode, with_rbac: bool) -> None:
    proxy = client()
    config = secured_mesh(mode, with_rbac)
    ctx = GenContext(MeshIndex(config, [proxy.as_workload()]), ResourceCache())
    sets = {t: gen(ctx, proxy) for t, gen in GENERATORS.items()}
    clusters = [unpack(r.any_bytes, Cluster) for r in sets[CLUSTER_TYPE].values()]
    # The config under test really has the shapes named in the test id.
    assert any(c.transport_socket_matches for c in clusters)  # type: ignore[attr-defined]
    listeners = [unpack(r.any_bytes, Listener) for r in sets[LISTENER_TYPE].values()]
    chains = {
        ls.address.socket_address.port_value: [c.name for c in ls.filter_chains]  # type: ignore[attr-defined]
        for ls in listeners
        if ls.traffic_direction == TrafficDirection.INBOUND  # type: ignore[attr-defined]
    }
    by_mode = {
        MtlsMode.STRICT: ["mtls"],
        MtlsMode.PERMISSIVE: ["mtls", "plaintext"],
        MtlsMode.DISABLE: ["plaintext"],
    }
    # Port-level modes win over the mesh-wide one (8000 DISABLE, 3306 STRICT).
    assert chains == {
        8000: ["plaintext"],
        8443: by_mode[mode],
        3306: ["mtls"],
        7000: by_mode[mode],
    }
    bootstrap = static_bootstrap(proxy, sets)
    bootstrap.static_resources.clusters.append(sds_cluster(tmp_path / "SDS"))
    result = validate(bootstrap, tmp_path / "envoy.json")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "deprecated" not in output.lower(), output


def test_harness_reaches_rbac_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above is meaningful for RBAC: Envoy compiles the policies' regexes, and one
    that is not RE2 fails validation."""
    monkeypatch.setattr(authz_rbac, "_SEGMENT", "([^/]+")  # unbalanced: not a valid regex
    proxy = client()
    ctx = GenContext(
        MeshIndex(secured_mesh(MtlsMode.PERMISSIVE, True), [proxy.as_workload()]),
        ResourceCache(),
    )
    sets = {t: gen(ctx, proxy) for t, gen in GENERATORS.items()}
    bootstrap = static_bootstrap(proxy, sets)
    bootstrap.static_resources.clusters.append(sds_cluster(tmp_path / "SDS"))
    result = validate(bootstrap, tmp_path / "envoy.json")
    assert result.returncode != 0
    assert "missing ): spiffe://" in result.stdout + result.stderr


def test_mtls_endpoint_reaches_cluster(tmp_path: Path) -> None:
    """An endpoint with a sidecar keeps its tlsMode label through the static fold."""
    proxy = client()
    config = MeshConfig(
        services=(kube("web", "default", ServicePort("http", 8080, Protocol.HTTP)),),
        workload_entries=(
            workload("web-1", "default", "127.0.2.9", "web", has_sidecar=True),
            workload("web-2", "default", "127.0.2.10", "web"),
        ),
        sidecars=(
            SidecarScope(
                "default",
                "c",
                SourceRef("Sidecar", "default", "c"),
                ingress=(IngressListener(SidecarPort(8000, Protocol.TCP)),),
            ),
        ),
    )
    ctx = GenContext(MeshIndex(config, [proxy.as_workload()]), ResourceCache())
    sets = {t: gen(ctx, proxy) for t, gen in GENERATORS.items()}
    bootstrap = static_bootstrap(proxy, sets)
    (web,) = [
        c
        for c in bootstrap.static_resources.clusters
        if c.name.endswith("web.default.svc.cluster.local")
    ]
    labelled = [
        e.endpoint.address.socket_address.address
        for group in web.load_assignment.endpoints
        for e in group.lb_endpoints
        if "envoy.transport_socket_match" in e.metadata.filter_metadata
        and e.metadata.filter_metadata["envoy.transport_socket_match"]["tlsMode"] == "istio"
    ]
    assert labelled == ["127.0.2.9"]
    bootstrap.static_resources.clusters.append(sds_cluster(tmp_path / "SDS"))
    result = validate(bootstrap, tmp_path / "envoy.json")
    assert result.returncode == 0, result.stdout + result.stderr
