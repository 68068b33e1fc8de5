"""Who may fetch a gateway certificate (control/secretaccess.py) and what an SDS name resolves
to (control/model/secret.py): sans-IO, proxies and identities in, verdicts out."""

from __future__ import annotations

import grpc
import pytest

from control.ca.identity import Identity
from control.model.index import MeshIndex
from control.model.proxy import Proxy, proxy_from_node
from control.model.secret import SecretIndex, TlsSecret, parse_sds_name, served_names
from control.model.types import MeshConfig, SourceRef
from control.secretaccess import SecretGuard, Verdict, decide, first_refusal
from control.xds.hooks import StreamRefused


def _proxy(kind: str = "router", namespace: str = "edge") -> Proxy:
    return proxy_from_node(f"{kind}~10.0.0.1~gw-1.{namespace}~{namespace}.svc.cluster.local", {})


EDGE = Identity("edge", "gateway")


class _Grants:
    """A ReferenceGrant in `shared` letting Gateways of `edge` read the Secret `wild`."""

    def allows_secret(self, from_namespace: str, to_namespace: str, name: str) -> bool:
        return (from_namespace, to_namespace, name) == ("edge", "shared", "wild")


def test_sds_names_parse_as_istio_names_them() -> None:
    ref = parse_sds_name("kubernetes://gw-cert")
    assert ref is not None and (ref.name, ref.namespace, ref.ca) == ("gw-cert", None, False)
    ref = parse_sds_name("kubernetes://gw-cert-cacert")
    assert ref is not None and ref.ca and ref.candidates() == ("gw-cert-cacert", "gw-cert")
    ref = parse_sds_name("kubernetes://shared/wild")
    assert ref is not None and (ref.namespace, ref.name) == ("shared", "wild")
    for bad in ("default", "kubernetes://", "kubernetes:///x", "kubernetes://a/b/c", "file-root:x"):
        assert parse_sds_name(bad) is None, bad


def test_a_router_reads_the_secrets_of_its_authenticated_namespace() -> None:
    for name in ("kubernetes://gw-cert", "kubernetes://gw-cert-cacert", "kubernetes://edge/gw"):
        d = decide(name, _proxy(), EDGE)
        assert d.allowed and d.namespace == "edge", (name, d)


def test_a_sidecar_never_reads_a_secret_even_in_its_namespace() -> None:
    d = decide("kubernetes://gw-cert", _proxy("sidecar"), EDGE)
    assert d.verdict is Verdict.DENIED and "only a gateway (router)" in d.reason


def test_the_namespace_comes_from_the_identity_never_the_node() -> None:
    # The node claims `edge`, the caller authenticated as `other`: refused.
    d = decide("kubernetes://gw-cert", _proxy(), Identity("other", "gateway"))
    assert d.verdict is Verdict.DENIED and "the caller is" in d.reason
    # No identity (the plaintext port): refused, whatever the node says.
    d = decide("kubernetes://gw-cert", _proxy(), None)
    assert d.verdict is Verdict.DENIED and "unauthenticated" in d.reason


def test_another_namespace_only_with_a_reference_grant() -> None:
    d = decide("kubernetes://shared/gw-cert", _proxy(), EDGE)
    assert d.verdict is Verdict.DENIED and "no ReferenceGrant" in d.reason
    assert decide("kubernetes://shared/wild", _proxy(), EDGE, _Grants()).allowed
    assert not decide("kubernetes://shared/tame", _proxy(), EDGE, _Grants()).allowed
    assert decide("kubernetes://shared/wild-cacert", _proxy(), EDGE, _Grants()).allowed


def test_malformed_names_and_wildcards() -> None:
    assert decide("default", _proxy(), EDGE).verdict is Verdict.MALFORMED
    assert first_refusal([], _proxy(), EDGE) is not None
    assert first_refusal(["*"], _proxy(), EDGE) is not None
    refusal = first_refusal(["kubernetes://a", "kubernetes://other/b"], _proxy(), EDGE)
    assert refusal is not None and "other/b" in refusal.reason
    assert first_refusal(["kubernetes://a", "kubernetes://edge/b"], _proxy(), EDGE) is None


def _secret(
    name: str, namespace: str = "edge", *, cert: bool = True, ca: bool = False
) -> TlsSecret:
    return TlsSecret(
        namespace,
        name,
        SourceRef("Secret", namespace, name),
        cert_chain=b"chain-" + name.encode() if cert else b"",
        private_key=b"key" if cert else b"",
        ca_cert=b"ca-" + name.encode() if ca else b"",
    )


def test_cacert_names_prefer_a_secret_of_exactly_that_name() -> None:
    both = _secret("gw", ca=True)
    separate = _secret("gw-cacert", cert=False, ca=True)
    names = served_names([both, separate])
    assert names["gw"].secret is both and not names["gw"].ca
    assert names["gw-cacert"].secret is separate and names["gw-cacert"].ca
    assert "gw-cacert-cacert" in names  # the separate one's own CA, by Istio's rule
    index = SecretIndex([both, separate])
    ref = parse_sds_name("kubernetes://gw-cacert")
    assert ref is not None
    served = index.resolve(ref, "edge")
    assert served is not None and served.secret is separate
    only = SecretIndex([both])
    served = only.resolve(ref, "edge")
    assert served is not None and served.secret is both and served.ca
    missing = parse_sds_name("kubernetes://nope")
    assert missing is not None and only.resolve(missing, "edge") is None


def test_the_guard_refuses_with_permission_denied_and_warns_of_missing_secrets(
    caplog: pytest.LogCaptureFixture,
) -> None:
    index = MeshIndex(MeshConfig(secrets=(_secret("gw-cert"),)))
    guard = SecretGuard(lambda: index)
    guard(_proxy(), EDGE, ["kubernetes://gw-cert"])  # allowed, exists: nothing to say
    assert not caplog.records
    with pytest.raises(StreamRefused) as info:
        guard(_proxy("sidecar"), EDGE, ["kubernetes://gw-cert"])
    assert info.value.code is grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(StreamRefused) as info:
        guard(_proxy(), EDGE, ["ROOTCA"])
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
    for _ in range(3):
        guard(_proxy(), EDGE, ["kubernetes://gw-cert", "kubernetes://missing"])
    warnings = [r for r in caplog.records if "kubernetes://missing" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].exc_info is None
    assert "no Secret edge/missing with tls.crt and tls.key" in warnings[0].getMessage()
