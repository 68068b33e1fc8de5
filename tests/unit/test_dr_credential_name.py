"""DestinationRule `tls.credentialName`, as Istio: a gateway originating TLS takes its client
certificate (MUTUAL) and the CA it verifies the server with from a Secret, over SDS
(`kubernetes://<name>`, `kubernetes://<name>-cacert`); a sidecar keeps the rule's files. The
two get different bytes under one cluster name, each in a slot of its own."""

from __future__ import annotations

import pytest
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.extensions.transport_sockets.tls.v3.tls_pb2 import UpstreamTlsContext
from google.protobuf.any_pb2 import Any as AnyProto

from control.config.errors import ConfigError
from control.config.loader import load_text
from control.generate import GENERATORS, ROUTER_GENERATORS
from control.generate.context import GenContext
from control.generate.resource_names import CLUSTER_TYPE
from control.model.index import MeshIndex
from control.model.proxy import proxy_from_node
from control.xds.cache import ResourceCache
from tests.support.traffic import mesh_config

EXTERNAL = """
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: secure, namespace: default}
spec:
  hosts: [secure.example.com]
  location: MESH_EXTERNAL
  resolution: STATIC
  ports: [{number: 8443, name: http, protocol: HTTP}]
  endpoints: [{address: "10.9.0.1"}]
"""
CLUSTER = "outbound|8443||secure.example.com"


def _rule(tls: str) -> str:
    return f"""
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: secure, namespace: default}}
spec:
  host: secure.example.com
  trafficPolicy: {{tls: {tls}}}
"""


def _context(proxy_type: str, tls: str) -> UpstreamTlsContext:
    ctx = GenContext(MeshIndex(mesh_config(EXTERNAL, _rule(tls)), []), ResourceCache())
    proxy = proxy_from_node(
        f"{proxy_type}~10.0.0.5~p.default~default.svc.cluster.local", {"SDS": "true"}
    )
    generators = ROUTER_GENERATORS if proxy.is_router else GENERATORS
    found = generators[CLUSTER_TYPE](ctx, proxy)[CLUSTER]
    cluster = Cluster.FromString(AnyProto.FromString(found.any_bytes).value)
    return UpstreamTlsContext.FromString(cluster.transport_socket.typed_config.value)


MUTUAL = (
    "{mode: MUTUAL, credentialName: egress-cred, clientCertificate: /c.pem, "
    "privateKey: /k.pem, caCertificates: /ca.pem, subjectAltNames: [secure.example.com]}"
)


def test_a_gateway_takes_the_secret_and_a_sidecar_the_files() -> None:
    router = _context("router", MUTUAL).common_tls_context
    assert [s.name for s in router.tls_certificate_sds_secret_configs] == [
        "kubernetes://egress-cred"
    ]
    combined = router.combined_validation_context
    assert combined.validation_context_sds_secret_config.name == "kubernetes://egress-cred-cacert"
    assert [
        m.matcher.exact for m in combined.default_validation_context.match_typed_subject_alt_names
    ] == ["secure.example.com"]
    assert not router.tls_certificates  # no file paths on the router
    sidecar = _context("sidecar", MUTUAL).common_tls_context
    assert [c.certificate_chain.filename for c in sidecar.tls_certificates] == ["/c.pem"]
    assert sidecar.validation_context.trusted_ca.filename == "/ca.pem"
    assert not sidecar.tls_certificate_sds_secret_configs


def test_simple_at_a_gateway_verifies_with_the_secret_ca_only() -> None:
    router = _context("router", "{mode: SIMPLE, credentialName: egress-cred}").common_tls_context
    assert not router.tls_certificate_sds_secret_configs
    assert router.combined_validation_context.validation_context_sds_secret_config.name == (
        "kubernetes://egress-cred-cacert"
    )


@pytest.mark.parametrize(
    ("tls", "message"),
    [
        ("{mode: MUTUAL}", "MUTUAL needs clientCertificate and privateKey, or credentialName"),
        ("{mode: SIMPLE, credentialName: Not_A_Name}", "credentialName"),
    ],
)
def test_errors(tls: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(_rule(tls).lstrip("\n-"), "t.yaml")
    assert message in str(info.value)


def test_mutual_with_only_a_credential_loads() -> None:
    config = mesh_config(EXTERNAL, _rule("{mode: MUTUAL, credentialName: egress-cred}"))
    assert [str(w) for w in config.warnings] == []
    (rule,) = config.destination_rules
    assert rule.policy is not None and rule.policy.tls is not None
    assert rule.policy.tls.credential_name == "egress-cred"
