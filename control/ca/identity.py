"""Workload identities: a Kubernetes-style namespace and service account, and the SPIFFE ID
they stand for in a trust domain."""

from __future__ import annotations

import re
from dataclasses import dataclass

# DNS-1123 label (namespace) and subdomain (service account), as Kubernetes allows them. The
# names end up inside a SPIFFE URI, so anything else (a "/", "..") must never get through.
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SPIFFE = re.compile(r"spiffe://([^/]+)/ns/([^/]+)/sa/([^/]+)")


class IdentityError(ValueError):
    """A namespace, service account or SPIFFE ID that is not well formed."""


@dataclass(frozen=True, slots=True)
class Identity:
    namespace: str
    service_account: str

    def __post_init__(self) -> None:
        if len(self.namespace) > 63 or not _LABEL.fullmatch(self.namespace):
            raise IdentityError(f"namespace {self.namespace!r} is not a DNS-1123 label")
        if len(self.service_account) > 253 or not _SUBDOMAIN.fullmatch(self.service_account):
            raise IdentityError(
                f"service account {self.service_account!r} is not a DNS-1123 subdomain"
            )

    def spiffe_id(self, trust_domain: str) -> str:
        return f"spiffe://{trust_domain}/ns/{self.namespace}/sa/{self.service_account}"

    @property
    def subject(self) -> str:
        """The Kubernetes service-account user name (a token's `sub`)."""
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    @classmethod
    def from_subject(cls, subject: str) -> Identity:
        parts = subject.split(":")
        if len(parts) != 4 or parts[:2] != ["system", "serviceaccount"]:
            raise IdentityError(
                f"subject {subject!r} is not system:serviceaccount:<namespace>:<name>"
            )
        return cls(parts[2], parts[3])

    def __str__(self) -> str:
        return f"{self.namespace}/{self.service_account}"


def parse_spiffe_id(uri: str) -> tuple[str, Identity]:
    """`spiffe://<trust domain>/ns/<ns>/sa/<sa>` -> (trust domain, identity)."""
    m = _SPIFFE.fullmatch(uri)
    if m is None:
        raise IdentityError(f"{uri!r} is not a workload SPIFFE ID (spiffe://<td>/ns/<ns>/sa/<sa>)")
    return m.group(1), Identity(m.group(2), m.group(3))
