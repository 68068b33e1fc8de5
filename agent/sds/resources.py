"""SDS resources: Envoy `Secret` protos for certificates and roots, each serialized once per
version and shared by every stream that sends it."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from envoy.extensions.transport_sockets.tls.v3.secret_pb2 import Secret
from google.protobuf.any_pb2 import Any as AnyProto

from protos import typeurls

# Istio's resource names: the workload certificate (chain + key) and the mesh root.
WORKLOAD_CERT = "default"
ROOT_CERT = "ROOTCA"


@dataclass(frozen=True, slots=True, eq=False)
class SecretEntry:
    """One secret as served: name, content version, and the packed Any (built once)."""

    name: str
    version: str
    resource: AnyProto

    @classmethod
    def of(cls, secret: Secret) -> SecretEntry:
        data = secret.SerializeToString(deterministic=True)
        # A content hash: the same certificate is the same version, whoever loaded it.
        version = hashlib.sha256(data).hexdigest()[:16]
        return cls(secret.name, version, AnyProto(type_url=typeurls.SECRET, value=data))

    def secret(self) -> Secret:
        s = Secret()
        s.ParseFromString(self.resource.value)
        return s


def tls_certificate(name: str, chain_pem: bytes, key_pem: bytes) -> SecretEntry:
    s = Secret(name=name)
    s.tls_certificate.certificate_chain.inline_bytes = chain_pem
    s.tls_certificate.private_key.inline_bytes = key_pem
    return SecretEntry.of(s)


def validation_context(name: str, ca_pem: bytes) -> SecretEntry:
    s = Secret(name=name)
    s.validation_context.trusted_ca.inline_bytes = ca_pem
    return SecretEntry.of(s)


def view_version(entries: Sequence[SecretEntry]) -> str:
    """The version_info of a response holding `entries`: the secret's own version when there
    is one (Envoy opens one stream per secret, so that is the usual case), else a digest."""
    if len(entries) == 1:
        return entries[0].version
    h = hashlib.sha256()
    for e in sorted(entries, key=lambda e: e.name):
        h.update(f"{e.name}={e.version};".encode())
    return h.hexdigest()[:16]
