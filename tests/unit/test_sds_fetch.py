"""The rules of a gateway certificate's upstream stream (agent/sds/fetch.py), sans-IO."""

from __future__ import annotations

import grpc
from envoy.extensions.transport_sockets.tls.v3.secret_pb2 import Secret
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryResponse
from google.protobuf.any_pb2 import Any as AnyProto

from agent.sds.fetch import Outcome, SecretFetch, is_remote_name
from protos import typeurls

NODE = "router~10.0.0.1~gw-1.edge~edge.svc.cluster.local"


def _response(*secrets: Secret, version: str = "v1", nonce: str = "n1") -> DiscoveryResponse:
    resp = DiscoveryResponse(type_url=typeurls.SECRET, version_info=version, nonce=nonce)
    for s in secrets:
        resp.resources.append(AnyProto(type_url=typeurls.SECRET, value=s.SerializeToString()))
    return resp


def _cert(name: str, chain: bytes = b"CHAIN", key: bytes = b"KEY") -> Secret:
    s = Secret(name=name)
    s.tls_certificate.certificate_chain.inline_bytes = chain
    s.tls_certificate.private_key.inline_bytes = key
    return s


def test_names_it_fetches() -> None:
    assert is_remote_name("kubernetes://gw-cert")
    assert not is_remote_name("kubernetes://") and not is_remote_name("default")


def test_first_request_names_the_secret_and_carries_the_node() -> None:
    f = SecretFetch("kubernetes://gw-cert", NODE, {"NAMESPACE": "edge"})
    req = f.first_request()
    assert req.type_url == typeurls.SECRET and list(req.resource_names) == ["kubernetes://gw-cert"]
    assert req.node.id == NODE and req.node.metadata["NAMESPACE"] == "edge"


def test_a_secret_is_acked_and_served() -> None:
    f = SecretFetch("kubernetes://gw-cert", NODE, {})
    step = f.on_response(_response(_cert("kubernetes://other"), _cert("kubernetes://gw-cert")))
    assert step.outcome is Outcome.SECRET and step.entry is not None
    assert step.entry.name == "kubernetes://gw-cert"
    assert step.entry.secret().tls_certificate.private_key.inline_bytes == b"KEY"
    assert (step.reply.version_info, step.reply.response_nonce) == ("v1", "n1")
    assert not step.reply.HasField("error_detail") and not step.reply.HasField("node")


def test_a_response_without_it_means_missing() -> None:
    f = SecretFetch("kubernetes://gw-cert", NODE, {})
    step = f.on_response(_response(version="v0"))
    assert step.outcome is Outcome.MISSING and step.entry is None
    assert step.reply.version_info == "v0" and not step.reply.HasField("error_detail")


def test_an_unusable_secret_is_nacked_keeping_the_acked_version() -> None:
    f = SecretFetch("kubernetes://gw-cert", NODE, {})
    assert f.on_response(_response(_cert("kubernetes://gw-cert"))).outcome is Outcome.SECRET
    step = f.on_response(_response(_cert("kubernetes://gw-cert", key=b""), version="v2"))
    assert step.outcome is Outcome.REJECTED
    assert step.reply.version_info == "v1" and step.reply.error_detail.message
    assert b"CHAIN" not in step.reply.error_detail.message.encode()
    # A CA name must carry a validation context.
    ca = SecretFetch("kubernetes://gw-cert-cacert", NODE, {})
    assert ca.on_response(_response(_cert("kubernetes://gw-cert-cacert"))).outcome is (
        Outcome.REJECTED
    )
    wrong_type = _response()
    wrong_type.type_url = typeurls.CLUSTER
    assert f.on_response(wrong_type).outcome is Outcome.REJECTED


def test_a_refusal_ends_the_fetch_anything_else_is_retried() -> None:
    end = SecretFetch.on_end(grpc.StatusCode.PERMISSION_DENIED, "only a gateway")
    assert end.refused and end.code is grpc.StatusCode.PERMISSION_DENIED
    assert end.message == "only a gateway"
    assert SecretFetch.on_end(grpc.StatusCode.INVALID_ARGUMENT, "bad name").refused
    assert not SecretFetch.on_end(grpc.StatusCode.UNAVAILABLE, "").refused
