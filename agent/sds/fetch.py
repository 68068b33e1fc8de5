"""Fetching one gateway certificate (`kubernetes://…`) from the control plane, sans-IO: the
rules of its ADS stream (SDS over ADS, DESIGN "Gateways").

Each such secret has an ADS stream of its own on the agent's one upstream channel, so that a
refusal (the control plane ends the stream with PERMISSION_DENIED when this proxy may not read
the secret) ends only that secret's stream: the proxy's relayed ADS, the agent stream and its
other secrets go on. `SecretFetch` says what to send first, what each response means (the
secret, or that the control plane has no such Secret yet) and how to answer it (ACK, or NACK
with the reason), and what the stream's end means (refused, or retry).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

import grpc
from envoy.extensions.transport_sockets.tls.v3.secret_pb2 import Secret
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest, DiscoveryResponse
from google.protobuf import struct_pb2
from google.protobuf.message import DecodeError

from agent.sds.names import REMOTE_PREFIX, is_remote_name
from agent.sds.resources import SecretEntry
from protos import typeurls

CACERT_SUFFIX = "-cacert"


class Outcome(enum.StrEnum):
    SECRET = "secret"  # a usable secret: serve it
    MISSING = "missing"  # the control plane has no such Secret (yet): keep waiting
    REJECTED = "rejected"  # the response is unusable: NACKed, the last good one stays


@dataclass(frozen=True, slots=True)
class FetchStep:
    outcome: Outcome
    reply: DiscoveryRequest  # the ACK or NACK to send
    entry: SecretEntry | None = None
    error: str = ""


@dataclass(frozen=True, slots=True)
class FetchEnd:
    # The control plane refused (PERMISSION_DENIED; INVALID_ARGUMENT for a name it cannot
    # serve): do not serve it, and answer Envoy with that status.
    refused: bool
    code: grpc.StatusCode
    message: str


class SecretFetch:
    """The rules of one secret's upstream stream. Not thread-safe; drive it from one task."""

    def __init__(self, name: str, node_id: str, metadata: Mapping[str, object]) -> None:
        self.name = name
        self._node_id = node_id
        self._metadata = metadata
        self.acked_version = ""

    def first_request(self) -> DiscoveryRequest:
        req = DiscoveryRequest(type_url=typeurls.SECRET, resource_names=[self.name])
        req.node.id = self._node_id
        meta = struct_pb2.Struct()
        meta.update(dict(self._metadata))
        req.node.metadata.CopyFrom(meta)
        return req

    def on_response(self, resp: DiscoveryResponse) -> FetchStep:
        reply = DiscoveryRequest(
            type_url=typeurls.SECRET,
            resource_names=[self.name],
            version_info=resp.version_info,
            response_nonce=resp.nonce,
        )
        try:
            entry = self._entry(resp)
        except ValueError as e:
            reply.version_info = self.acked_version
            reply.error_detail.code = grpc.StatusCode.INVALID_ARGUMENT.value[0]
            reply.error_detail.message = str(e)
            return FetchStep(Outcome.REJECTED, reply, error=str(e))
        self.acked_version = resp.version_info
        if entry is None:
            return FetchStep(Outcome.MISSING, reply)
        return FetchStep(Outcome.SECRET, reply, entry)

    def _entry(self, resp: DiscoveryResponse) -> SecretEntry | None:
        if resp.type_url != typeurls.SECRET:
            raise ValueError(f"expected {typeurls.SECRET}, got {resp.type_url!r}")
        for any_msg in resp.resources:
            if any_msg.type_url != typeurls.SECRET:
                raise ValueError(f"a resource of type {any_msg.type_url!r} in an SDS response")
            secret = Secret()
            try:
                secret.ParseFromString(any_msg.value)
            except DecodeError:
                raise ValueError("a Secret that does not decode") from None
            if secret.name != self.name:
                continue  # not ours (a SotW response may carry others); ignore it
            self._check(secret)
            return SecretEntry.of(secret)
        return None

    def _check(self, secret: Secret) -> None:
        # Never the contents in a message: they are key material.
        if self.name.endswith(CACERT_SUFFIX):
            if not secret.validation_context.trusted_ca.inline_bytes:
                raise ValueError(f"{self.name}: no inline trusted CA")
            return
        cert = secret.tls_certificate
        if not cert.certificate_chain.inline_bytes or not cert.private_key.inline_bytes:
            raise ValueError(f"{self.name}: no inline certificate chain and private key")

    @staticmethod
    def on_end(code: grpc.StatusCode, details: str) -> FetchEnd:
        """What the end of the stream means; anything but a refusal is retried."""
        refused = code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT)
        return FetchEnd(refused, code, details or code.name.lower().replace("_", " "))


__all__ = [
    "REMOTE_PREFIX",
    "FetchEnd",
    "FetchStep",
    "Outcome",
    "SecretFetch",
    "is_remote_name",
]
