"""Fuzzing the live control plane (hypothesis, bounded budget): CSRs of every kind against
CreateCertificate, and random DiscoveryRequest sequences against the ADS server. The control
plane runs on its own event loop in a thread; the fuzzer calls it over real gRPC.

Invariants: a CSR is answered OK, INVALID_ARGUMENT or UNAUTHENTICATED, never
INTERNAL/UNKNOWN; an ADS stream ends only with INVALID_ARGUMENT (bad input) or not at all; no
unhandled exception is logged; nonces are unique per stream."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed25519, rsa
from cryptography.x509.oid import NameOID
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest, DiscoveryResponse
from hypothesis import example, given
from hypothesis import strategies as st

from protos import ca_pb2, ca_pb2_grpc, typeurls
from tests.support.adsclient import SOTW, node_id
from tests.support.fuzz import ControlPlaneThread, ErrorLog, fuzz_settings

MESH = """\
apiVersion: v1
kind: Service
metadata: {name: alpha, namespace: default}
spec:
  selector: {app: alpha}
  ports: [{name: http, port: 9080, targetPort: 8080}]
"""


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneThread]:
    d = tmp_path_factory.mktemp("fuzzcfg")
    (d / "mesh.yaml").write_text(MESH)
    t = ControlPlaneThread(d)
    with ErrorLog() as errors:
        t.start()
        try:
            yield t
        finally:
            t.stop()
    assert not errors.records, errors.messages()


def _csr(key: Any, algorithm: Any) -> bytes:
    csr = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fuzz")])
    )
    return csr.sign(key, algorithm).public_bytes(serialization.Encoding.PEM)


# Keys made once: generating RSA keys per example would spend the budget on key generation.
# The CA signs P-256, P-384 and RSA >= 2048 (DESIGN: the agent uses P-256 or RSA 2048); every
# other key is refused with INVALID_ARGUMENT.
_KEYS = {
    "ec-p256": (ec.generate_private_key(ec.SECP256R1()), hashes.SHA256()),
    "ec-p384": (ec.generate_private_key(ec.SECP384R1()), hashes.SHA384()),
    "rsa-2048": (rsa.generate_private_key(65537, 2048), hashes.SHA256()),
    "ec-p521": (ec.generate_private_key(ec.SECP521R1()), hashes.SHA512()),
    "ec-k256": (ec.generate_private_key(ec.SECP256K1()), hashes.SHA256()),
    "rsa-1024": (rsa.generate_private_key(65537, 1024), hashes.SHA256()),
    "ed25519": (ed25519.Ed25519PrivateKey.generate(), None),
    "dsa": (dsa.generate_private_key(2048), hashes.SHA256()),
}
_ACCEPTED = {"ec-p256", "ec-p384", "rsa-2048"}
_GOOD = _csr(*_KEYS["ec-p256"])


def _bad_signature(at: int) -> str:
    """The good CSR with one bit of its signature (the DER's tail) flipped."""
    der = bytearray(x509.load_pem_x509_csr(_GOOD).public_bytes(serialization.Encoding.DER))
    der[len(der) - 1 - at] ^= 0x01
    body = base64.encodebytes(bytes(der)).decode()
    return f"-----BEGIN CERTIFICATE REQUEST-----\n{body}-----END CERTIFICATE REQUEST-----\n"


# (csr, expected status for an authenticated caller; None: OK or INVALID_ARGUMENT).
OK, BAD = grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT
csrs: st.SearchStrategy[tuple[str, grpc.StatusCode | None]] = st.one_of(
    st.binary(max_size=4096).map(lambda b: (b.decode("latin-1"), BAD)),
    st.sampled_from(sorted(_KEYS)).map(
        lambda k: (_csr(*_KEYS[k]).decode(), OK if k in _ACCEPTED else BAD)
    ),
    st.integers(0, 20).map(lambda at: (_bad_signature(at), BAD)),
    # A valid CSR, cut or corrupted somewhere (some corruptions are harmless: whitespace).
    st.tuples(st.integers(0, len(_GOOD)), st.binary(max_size=8)).map(
        lambda t: ((_GOOD[: t[0]] + t[1] + _GOOD[t[0] :]).decode("latin-1"), None)
    ),
    # Huge: megabytes of PEM-looking text (over gRPC's 4 MB limit: RESOURCE_EXHAUSTED).
    st.integers(1, 3).map(
        lambda n: (
            "-----BEGIN CERTIFICATE REQUEST-----\n"
            + "QUFB\n" * (n * 200_000)
            + "-----END CERTIFICATE REQUEST-----\n",
            None,
        )
    ),
)


@fuzz_settings(60)
@example(csr=(_bad_signature(0), BAD), ttl=3600, with_token=True)
@example(csr=(_csr(*_KEYS["ed25519"]).decode(), BAD), ttl=3600, with_token=True)
@example(csr=(_csr(*_KEYS["dsa"]).decode(), BAD), ttl=3600, with_token=True)
@given(csr=csrs, ttl=st.integers(-10, 10**9), with_token=st.booleans())
def test_csr_fuzz_gets_clean_statuses(
    live: ControlPlaneThread, csr: tuple[str, grpc.StatusCode | None], ttl: int, with_token: bool
) -> None:
    text, expected = csr
    md = (("authorization", f"Bearer {live.token()}"),) if with_token else ()
    opts = [("grpc.max_send_message_length", 64 << 20)]
    with grpc.secure_channel(live.secure_target, live.tls_credentials(), options=opts) as ch:
        stub = ca_pb2_grpc.IstioCertificateServiceStub(ch)
        try:
            stub.CreateCertificate(
                ca_pb2.IstioCertificateRequest(csr=text, validity_duration=ttl),
                metadata=md,
                timeout=20,
            )
            code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            code = e.code()
    if len(text) > 4 << 20:
        assert code is grpc.StatusCode.RESOURCE_EXHAUSTED  # gRPC's own message size limit
    elif not with_token:
        assert code is grpc.StatusCode.UNAUTHENTICATED
    elif ttl < 0:
        assert code is BAD  # a negative validity is refused whatever the CSR
    elif expected is None:
        assert code in (OK, BAD)
    else:
        assert code is expected


TYPES = [
    typeurls.CLUSTER,
    typeurls.ENDPOINT,
    typeurls.LISTENER,
    typeurls.ROUTE,
    typeurls.DEBUG_SYNCZ,
    "type.googleapis.com/not.a.Type",
    "",
]

requests = st.lists(
    st.tuples(
        st.sampled_from(TYPES),
        st.lists(
            st.sampled_from(
                ["", "*", "alpha", "outbound|9080||alpha.default.svc.cluster.local", "\x00x"]
            ),
            max_size=3,
        ),
        st.sampled_from(["", "v1", "v2", "garbage", "x" * 300]),  # response_nonce
        st.sampled_from(["", "v", "whatever"]),  # version_info
        st.sampled_from(["", "bad config", "\u00e9" * 50]),  # error_detail message
    ),
    min_size=1,
    max_size=8,
)


@fuzz_settings(40)
@given(reqs=requests, with_node=st.booleans())
def test_discovery_request_sequences_against_the_live_server(
    live: ControlPlaneThread, reqs: list[tuple[str, list[str], str, str, str]], with_node: bool
) -> None:
    assert live.cp is not None
    with grpc.insecure_channel(f"127.0.0.1:{live.cp.xds_port}") as ch:
        out: list[DiscoveryRequest] = []
        for i, (type_url, names, nonce, version, error) in enumerate(reqs):
            req = DiscoveryRequest(
                type_url=type_url,
                resource_names=names,
                response_nonce=nonce,
                version_info=version,
            )
            if error:
                req.error_detail.code = 3
                req.error_detail.message = error
            if i == 0 and with_node:
                req.node.id = node_id("127.0.0.77", "fuzz")
            out.append(req)
        call = ch.stream_stream(
            SOTW,
            request_serializer=DiscoveryRequest.SerializeToString,
            response_deserializer=DiscoveryResponse.FromString,
        )(iter(out), timeout=1.5)
        nonces: list[str] = []
        code = grpc.StatusCode.OK
        try:
            for resp in call:
                nonces.append(resp.nonce)
        except grpc.RpcError as e:
            code = e.code()
    # Bad input ends the stream with INVALID_ARGUMENT; otherwise it stays open until the
    # client's deadline (or ends as the client half-closes).
    assert code in (
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    ), code
    if not with_node or reqs[0][0] == "":
        assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert len(nonces) == len(set(nonces)), nonces
