"""SDS for routers (control/generate/secrets.py) and how a rotation is pushed (model/index.py):
sans-IO, real certificates."""

from __future__ import annotations

import dataclasses

from envoy.extensions.transport_sockets.tls.v3.secret_pb2 import Secret
from google.protobuf.any_pb2 import Any as AnyProto

from control.ca.identity import Identity
from control.generate import secrets
from control.generate.context import GenContext, next_context
from control.model.index import MeshIndex, endpoints_only
from control.model.proxy import Proxy, proxy_from_node
from control.model.secret import TlsSecret
from control.model.types import MeshConfig, SourceRef
from control.secretaccess import decide
from control.xds.cache import ResourceCache
from tests.support.gatewayapi import (
    gateway,
    gateway_class,
    listener,
    load,
    reference_grant,
    status_of,
)
from tests.support.secrets import any_tls_secret
from tests.support.testca import TestCA

CA = TestCA()


def _proxy(kind: str, namespace: str, pod: str = "gw-1") -> Proxy:
    return proxy_from_node(f"{kind}~10.0.0.1~{pod}.{namespace}~{namespace}.svc.cluster.local", {})


def _secret(name: str, namespace: str = "edge", *, ca: bool = False) -> TlsSecret:
    cert = CA.server_cert([f"{name}.example.com"])
    return TlsSecret(
        namespace,
        name,
        SourceRef("Secret", namespace, name),
        cert.cert_pem,
        cert.key_pem,
        CA.root_pem if ca else b"",
    )


def _decoded(any_bytes: bytes) -> Secret:
    s = Secret()
    AnyProto.FromString(any_bytes).Unpack(s)
    return s


def test_a_router_gets_its_namespace_secrets_under_both_names_a_sidecar_none() -> None:
    gw, other = _secret("gw", ca=True), _secret("gw", "other")
    ctx = GenContext(MeshIndex(MeshConfig(secrets=(gw, other))), ResourceCache())
    got = secrets.generate(ctx, _proxy("router", "edge"))
    assert set(got) == {
        "kubernetes://gw",
        "kubernetes://edge/gw",
        "kubernetes://gw-cacert",
        "kubernetes://edge/gw-cacert",
    }
    s = _decoded(got["kubernetes://gw"].any_bytes)
    assert s.name == "kubernetes://gw"
    assert s.tls_certificate.certificate_chain.inline_bytes == gw.cert_chain
    assert s.tls_certificate.private_key.inline_bytes == gw.private_key
    ca = _decoded(got["kubernetes://edge/gw-cacert"].any_bytes)
    assert ca.validation_context.trusted_ca.inline_bytes == CA.root_pem
    # The same short name in another namespace is that namespace's Secret.
    theirs = secrets.generate(ctx, _proxy("router", "other"))
    assert set(theirs) == {"kubernetes://gw", "kubernetes://other/gw"}
    assert _decoded(
        theirs["kubernetes://gw"].any_bytes
    ).tls_certificate.certificate_chain.inline_bytes == (other.cert_chain)
    assert len(secrets.generate(ctx, _proxy("sidecar", "edge"))) == 0


def test_routers_of_a_namespace_share_the_bytes_and_grants_add_other_namespaces() -> None:
    cache = ResourceCache()
    index = MeshIndex(MeshConfig(secrets=(_secret("gw"), _secret("wild", "shared"))))
    ctx = GenContext(index, cache)
    a = secrets.generate(ctx, _proxy("router", "edge", "gw-1"))
    b = secrets.generate(ctx, _proxy("router", "edge", "gw-2"))
    assert a["kubernetes://gw"] is b["kubernetes://gw"]
    assert "kubernetes://shared/wild" not in a

    class Grants:
        def allows_secret(self, from_namespace: str, to_namespace: str, name: str) -> bool:
            return (from_namespace, to_namespace, name) == ("edge", "shared", "wild")

    granted = MeshIndex(index.config)
    granted.secret_grants = Grants()
    got = secrets.generate(GenContext(granted, cache), _proxy("router", "edge"))
    assert "kubernetes://shared/wild" in got and "kubernetes://wild" not in got


def test_a_rotation_is_an_sds_change_only_and_reencodes_just_that_secret() -> None:
    gw, two = _secret("gw"), _secret("two")
    cache = ResourceCache()
    old = MeshIndex(MeshConfig(secrets=(gw, two)))
    ctx = GenContext(old, cache)
    router = _proxy("router", "edge")
    before = secrets.generate(ctx, router)
    rotated = dataclasses.replace(gw, cert_chain=_secret("gw").cert_chain)
    new = old.next(MeshConfig(secrets=(rotated, two)))
    # Same Secrets, new contents: derived, and nothing but endpoints (and SDS) may change.
    assert new.changed_since(old) is not None and endpoints_only(old, new)
    made = cache.serializations
    after = secrets.generate(next_context(ctx, new), router)
    assert cache.serializations - made == 2  # gw under its two names, nothing else
    assert after["kubernetes://two"] is before["kubernetes://two"]
    assert _decoded(
        after["kubernetes://gw"].any_bytes
    ).tls_certificate.certificate_chain.inline_bytes == (rotated.cert_chain)
    # A Secret that appears (listeners may use it) is a full push.
    grown = new.next(MeshConfig(secrets=(rotated, two, _secret("three"))))
    assert grown.changed_since(new) is None and not endpoints_only(new, grown)


def test_gateway_api_certificate_refs_across_namespaces_follow_reference_grants() -> None:
    https = listener(
        "https", 8443, "HTTPS", tls={"certificateRefs": [{"name": "shared", "namespace": "certs"}]}
    )
    objects = (gateway_class(), gateway(listeners=[https]), any_tls_secret("shared", "certs"))
    router = _proxy("router", "infra")
    identity = Identity("infra", "gw")

    # Without a ReferenceGrant: not resolved, not served, and the router is refused.
    mesh = load(*objects)
    assert _resolved_refs(mesh) == (False, "RefNotPermitted")
    index = MeshIndex(mesh)
    assert "kubernetes://certs/shared" not in secrets.generate(
        GenContext(index, ResourceCache()), router
    )
    assert not decide("kubernetes://certs/shared", router, identity, index.secret_grants).allowed

    # With one: the certificate is served to the Gateway's routers, and only to them.
    grant = reference_grant(
        "certs-to-infra", "certs", "infra", from_kind="Gateway", to_kind="Secret"
    )
    granted = MeshIndex(load(*objects, grant))
    got = secrets.generate(GenContext(granted, ResourceCache()), router)
    assert "kubernetes://certs/shared" in got
    assert decide("kubernetes://certs/shared", router, identity, granted.secret_grants).allowed
    elsewhere = _proxy("router", "other")
    assert "kubernetes://certs/shared" not in secrets.generate(
        GenContext(granted, ResourceCache()), elsewhere
    )
    assert not decide(
        "kubernetes://certs/shared", elsewhere, Identity("other", "gw"), granted.secret_grants
    ).allowed

    # A certificateRef to a Secret that does not exist does not resolve.
    missing = load(gateway_class(), gateway(listeners=[https]), grant)
    assert _resolved_refs(missing) == (False, "InvalidCertificateRef")
    assert _resolved_refs(load(*objects, grant)) == (True, "ResolvedRefs")


def _resolved_refs(mesh: MeshConfig) -> tuple[bool, str]:
    (listener_status,) = status_of(mesh, "Gateway", "infra", "gw").listeners
    (cond,) = [c for c in listener_status.conditions if c.type == "ResolvedRefs"]
    return cond.status, cond.reason
