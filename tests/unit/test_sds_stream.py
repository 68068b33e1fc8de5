"""SdsStream (agent/sds/stream.py): the SotW rules of one StreamSecrets stream, sans-IO.

Secrets are real `Secret` protos built from real certificates of the test CA, so the bytes
in a response are what Envoy would decode."""

from __future__ import annotations

import pytest
from envoy.extensions.transport_sockets.tls.v3.secret_pb2 import Secret
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest
from google.rpc.status_pb2 import Status

from agent.sds.resources import (
    ROOT_CERT,
    WORKLOAD_CERT,
    SecretEntry,
    tls_certificate,
    validation_context,
)
from agent.sds.stream import RequestKind, SdsProtocolError, SdsStream
from protos import typeurls
from tests.support.testca import TestCA

ID = "spiffe://cluster.local/ns/default/sa/default"


@pytest.fixture(scope="module")
def ca() -> TestCA:
    return TestCA()


def cert(ca: TestCA) -> SecretEntry:
    issued = ca.client_cert(ID)
    return tls_certificate(WORKLOAD_CERT, issued.cert_pem, issued.key_pem)


def root(ca: TestCA) -> SecretEntry:
    return validation_context(ROOT_CERT, ca.root_pem)


def req(
    *names: str, nonce: str = "", version: str = "", nack: str = "", type_url: str = typeurls.SECRET
) -> DiscoveryRequest:
    r = DiscoveryRequest(
        type_url=type_url, resource_names=names, response_nonce=nonce, version_info=version
    )
    if nack:
        r.error_detail.CopyFrom(Status(code=3, message=nack))
    return r


def test_first_request_is_answered_with_the_secret(ca: TestCA) -> None:
    s = SdsStream()
    out = s.receive(req(WORKLOAD_CERT))
    assert out.kind is RequestKind.INITIAL and out.must_respond
    assert out.added == {WORKLOAD_CERT}
    entry = cert(ca)
    resp = s.respond({WORKLOAD_CERT: entry, ROOT_CERT: root(ca)}, force=out.must_respond)
    assert resp is not None
    assert resp.names == [WORKLOAD_CERT]  # only what was asked for
    proto = resp.to_proto()
    assert proto.type_url == typeurls.SECRET and proto.nonce == resp.nonce
    secret = Secret()
    proto.resources[0].Unpack(secret)
    assert secret.name == WORKLOAD_CERT
    assert secret.tls_certificate.certificate_chain.inline_bytes.startswith(b"-----BEGIN CERT")
    assert b"PRIVATE KEY" in secret.tls_certificate.private_key.inline_bytes
    assert proto.version_info == entry.version


def test_secret_that_does_not_exist_yet_is_sent_when_it_appears(ca: TestCA) -> None:
    s = SdsStream()
    out = s.receive(req(WORKLOAD_CERT))
    # Never an empty response: Envoy rejects an SDS update without its secret.
    assert s.respond({}, force=out.must_respond) is None
    assert s.respond({ROOT_CERT: root(ca)}) is None
    resp = s.respond({WORKLOAD_CERT: cert(ca)})
    assert resp is not None and resp.names == [WORKLOAD_CERT]


def test_ack_records_and_sends_nothing_until_the_secret_changes(ca: TestCA) -> None:
    s = SdsStream()
    s.receive(req(WORKLOAD_CERT))
    first = cert(ca)
    resp = s.respond({WORKLOAD_CERT: first}, force=True)
    assert resp is not None
    out = s.receive(req(WORKLOAD_CERT, nonce=resp.nonce, version=resp.version_info))
    assert out.kind is RequestKind.ACK and not out.must_respond
    assert s.acked_version == first.version and s.acked_nonce == resp.nonce
    assert s.respond({WORKLOAD_CERT: first}) is None
    rotated = cert(ca)
    push = s.respond({WORKLOAD_CERT: rotated})
    assert push is not None and push.version_info == rotated.version
    assert push.nonce != resp.nonce


def test_stale_nonce_is_ignored(ca: TestCA) -> None:
    s = SdsStream()
    s.receive(req(WORKLOAD_CERT))
    r1 = s.respond({WORKLOAD_CERT: cert(ca)}, force=True)
    r2 = s.respond({WORKLOAD_CERT: cert(ca)})
    assert r1 is not None and r2 is not None
    # An ACK of the first response that arrives after the second was sent.
    out = s.receive(req(WORKLOAD_CERT, ROOT_CERT, nonce=r1.nonce))
    assert out.kind is RequestKind.STALE and not out.must_respond
    assert s.names == {WORKLOAD_CERT}  # the stale request's names were not applied
    assert s.acked_nonce == ""


def test_nack_is_recorded_and_the_rejected_secret_is_not_resent(ca: TestCA) -> None:
    s = SdsStream()
    s.receive(req(WORKLOAD_CERT))
    bad = cert(ca)
    resp = s.respond({WORKLOAD_CERT: bad}, force=True)
    assert resp is not None
    out = s.receive(req(WORKLOAD_CERT, nonce=resp.nonce, nack="bad key"))
    assert out.kind is RequestKind.NACK and out.error_message == "bad key"
    assert not out.must_respond
    assert s.nack_message == "bad key" and s.nacks == 1
    assert s.respond({WORKLOAD_CERT: bad}) is None  # never the same bytes again
    fixed = cert(ca)
    assert s.respond({WORKLOAD_CERT: fixed}) is not None  # a change is sent
    # The ACK of the fixed version clears the NACK.
    s.receive(req(WORKLOAD_CERT, nonce=s.sent_nonce, version=fixed.version))
    assert s.nack_message == "" and s.acked_version == fixed.version


def test_newly_subscribed_name_is_always_answered(ca: TestCA) -> None:
    s = SdsStream()
    s.receive(req(WORKLOAD_CERT))
    secrets = {WORKLOAD_CERT: cert(ca), ROOT_CERT: root(ca)}
    r1 = s.respond(secrets, force=True)
    assert r1 is not None
    out = s.receive(req(WORKLOAD_CERT, ROOT_CERT, nonce=r1.nonce))
    assert out.kind is RequestKind.ACK and out.must_respond and out.added == {ROOT_CERT}
    r2 = s.respond(secrets, force=out.must_respond)
    assert r2 is not None and r2.names == [ROOT_CERT, WORKLOAD_CERT]
    # Dropping a name reports it, so the adapter can stop watching it.
    out = s.receive(req(ROOT_CERT, nonce=r2.nonce))
    assert out.removed == {WORKLOAD_CERT} and not out.must_respond


def test_new_name_with_a_nack_is_still_answered(ca: TestCA) -> None:
    s = SdsStream()
    s.receive(req(WORKLOAD_CERT))
    secrets = {WORKLOAD_CERT: cert(ca), ROOT_CERT: root(ca)}
    r1 = s.respond(secrets, force=True)
    assert r1 is not None
    out = s.receive(req(WORKLOAD_CERT, ROOT_CERT, nonce=r1.nonce, nack="no"))
    assert out.kind is RequestKind.NACK and out.must_respond


def test_request_without_nonce_restarts_the_subscription(ca: TestCA) -> None:
    s = SdsStream()
    s.receive(req(WORKLOAD_CERT))
    entry = cert(ca)
    r1 = s.respond({WORKLOAD_CERT: entry}, force=True)
    assert r1 is not None
    s.receive(req(WORKLOAD_CERT, nonce=r1.nonce, version=r1.version_info))
    # Envoy reconnected (new stream state on its side) and asks again with its version.
    out = s.receive(req(WORKLOAD_CERT, version=r1.version_info))
    assert out.kind is RequestKind.INITIAL and out.must_respond
    r2 = s.respond({WORKLOAD_CERT: entry}, force=out.must_respond)
    assert r2 is not None and r2.version_info == r1.version_info


def test_multi_name_response_version_changes_with_any_secret(ca: TestCA) -> None:
    s = SdsStream()
    s.receive(req(WORKLOAD_CERT, ROOT_CERT))
    rootca = root(ca)
    r1 = s.respond({WORKLOAD_CERT: cert(ca), ROOT_CERT: rootca}, force=True)
    assert r1 is not None
    r2 = s.respond({WORKLOAD_CERT: cert(ca), ROOT_CERT: rootca})
    assert r2 is not None and r2.version_info != r1.version_info


def test_wrong_type_url_is_a_protocol_error() -> None:
    with pytest.raises(SdsProtocolError, match="Secret"):
        SdsStream().receive(req(WORKLOAD_CERT, type_url=typeurls.CLUSTER))


def test_empty_type_url_means_secret(ca: TestCA) -> None:
    s = SdsStream()
    assert s.receive(req(WORKLOAD_CERT, type_url="")).kind is RequestKind.INITIAL


def test_entry_version_is_a_content_hash(ca: TestCA) -> None:
    a = validation_context(ROOT_CERT, ca.root_pem)
    b = validation_context(ROOT_CERT, ca.root_pem)
    assert a.version == b.version
    assert a.secret().validation_context.trusted_ca.inline_bytes == ca.root_pem
    assert validation_context(ROOT_CERT, ca.root_pem + b"\n").version != a.version
