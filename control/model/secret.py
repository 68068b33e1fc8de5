"""Gateway certificates in the model: `v1 Secret`s holding a certificate chain and key (and an
optional CA bundle), and which of them a namespace's routers see under which SDS names.

Names are Istio's: `kubernetes://<name>` is the Secret `<name>` in the router's namespace
(its certificate and key), `kubernetes://<name>-cacert` its `ca.crt` as a validation
context, and `kubernetes://<namespace>/<name>[-cacert]` names the namespace explicitly (the
Gateway API's cross-namespace `certificateRefs`). For a `-cacert` name a Secret of exactly
that name is used first and then the Secret without the suffix, as istiod resolves it.

Key material never appears in a repr (logs, debug output): the byte fields are hidden.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from control.model.gatewayapi import GROUP, ReferenceGrant, reference_granted
from control.model.types import SourceRef

SDS_PREFIX: Final = "kubernetes://"
CACERT_SUFFIX: Final = "-cacert"


class ReferenceGrants(Protocol):
    """Whether routers of `from_namespace` may read the Secret `to_namespace/name` (a
    ReferenceGrant in `to_namespace` from Gateways of `from_namespace` to that Secret, or to
    every Secret there)."""

    def allows_secret(self, from_namespace: str, to_namespace: str, name: str) -> bool: ...


class _NoGrants:
    def allows_secret(self, from_namespace: str, to_namespace: str, name: str) -> bool:
        return False


# Same-namespace only (MeshIndex.secret_grants without Gateway API ReferenceGrants).
NO_GRANTS: Final[ReferenceGrants] = _NoGrants()


class GatewayGrants:
    """ReferenceGrants as the access rule asks them: a Gateway of `from_namespace` (the
    router's: a Gateway API Gateway is served by routers of its namespace) to the Secret."""

    def __init__(self, grants: Iterable[ReferenceGrant]) -> None:
        self._grants = tuple(grants)

    def allows_secret(self, from_namespace: str, to_namespace: str, name: str) -> bool:
        return reference_granted(
            self._grants, (GROUP, "Gateway", from_namespace), ("", "Secret", to_namespace, name)
        )


@dataclass(frozen=True, slots=True)
class TlsSecret:
    """One Secret as served. `cert_chain`/`private_key` are empty for a CA-only Secret;
    `ca_cert` is empty when it has no `ca.crt`."""

    namespace: str
    name: str
    source: SourceRef = field(compare=False)
    cert_chain: bytes = field(default=b"", repr=False)
    private_key: bytes = field(default=b"", repr=False)
    ca_cert: bytes = field(default=b"", repr=False)

    @property
    def has_certificate(self) -> bool:
        return bool(self.cert_chain)

    @property
    def has_ca(self) -> bool:
        return bool(self.ca_cert)

    @property
    def shape(self) -> tuple[str, str, bool, bool]:
        """What listeners may depend on (which Secrets exist, with which parts); a change of
        contents alone (a rotation) changes only the SDS resources."""
        return (self.namespace, self.name, self.has_certificate, self.has_ca)


@dataclass(frozen=True, slots=True)
class SecretRef:
    """An SDS resource name, parsed: `namespace` None means the router's own."""

    name: str  # as written, with the -cacert suffix for a CA request
    namespace: str | None = None
    ca: bool = False

    def candidates(self) -> tuple[str, ...]:
        """The Secret names that may answer it, in order."""
        if self.ca:
            return (self.name, self.name.removesuffix(CACERT_SUFFIX))
        return (self.name,)


def parse_sds_name(resource: str) -> SecretRef | None:
    """The Secret an SDS name asks for; None when it is not a `kubernetes://` name or is
    malformed (empty parts, more than one `/`)."""
    if not resource.startswith(SDS_PREFIX):
        return None
    rest = resource.removeprefix(SDS_PREFIX)
    namespace: str | None = None
    if "/" in rest:
        namespace, _, rest = rest.partition("/")
        if not namespace or "/" in rest:
            return None
    if not rest:
        return None
    ca = rest.endswith(CACERT_SUFFIX) and len(rest) > len(CACERT_SUFFIX)
    return SecretRef(rest, namespace, ca)


@dataclass(frozen=True, slots=True)
class Served:
    """What one SDS name resolves to: a Secret and which part of it."""

    secret: TlsSecret
    ca: bool  # the validation context (ca.crt) rather than the certificate and key


def served_names(secrets: Iterable[TlsSecret]) -> dict[str, Served]:
    """The names (without prefix or namespace) under which the Secrets of one namespace are
    served, and what each resolves to."""
    by_name = {s.name: s for s in secrets}
    out: dict[str, Served] = {}
    for s in by_name.values():
        # A name ending in -cacert is always a CA request (istiod reads it so too).
        if s.has_certificate and not s.name.endswith(CACERT_SUFFIX):
            out[s.name] = Served(s, ca=False)
    for suffixed in (True, False):
        for s in by_name.values():
            if not s.has_ca:
                continue
            if suffixed and s.name.endswith(CACERT_SUFFIX):
                out[s.name] = Served(s, ca=True)  # a Secret of exactly the asked name first
            elif not suffixed:
                out.setdefault(s.name + CACERT_SUFFIX, Served(s, ca=True))
    return out


class SecretIndex:
    """The Secrets of one snapshot by namespace."""

    def __init__(self, secrets: Iterable[TlsSecret] = ()) -> None:
        self._by_namespace: dict[str, dict[str, TlsSecret]] = {}
        for s in secrets:
            self._by_namespace.setdefault(s.namespace, {})[s.name] = s

    def get(self, namespace: str, name: str) -> TlsSecret | None:
        return self._by_namespace.get(namespace, {}).get(name)

    def in_namespace(self, namespace: str) -> Mapping[str, TlsSecret]:
        return self._by_namespace.get(namespace, {})

    def namespaces(self) -> Iterator[str]:
        return iter(sorted(self._by_namespace))

    def resolve(self, ref: SecretRef, own_namespace: str) -> Served | None:
        """What `ref` resolves to for a router of `own_namespace` (access is decided
        elsewhere: control/secretaccess.py)."""
        namespace = ref.namespace or own_namespace
        for name in ref.candidates():
            s = self.get(namespace, name)
            if s is None:
                continue
            if ref.ca and s.has_ca:
                return Served(s, ca=True)
            if not ref.ca and s.has_certificate:
                return Served(s, ca=False)
        return None


__all__ = [
    "CACERT_SUFFIX",
    "NO_GRANTS",
    "SDS_PREFIX",
    "GatewayGrants",
    "ReferenceGrants",
    "SecretIndex",
    "SecretRef",
    "Served",
    "TlsSecret",
    "parse_sds_name",
    "served_names",
]
