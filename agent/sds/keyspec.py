"""Which key a workload has: its SPIFFE identity, the key type, and a new key with its CSR.

No cryptography here. The agent's own process names these on its way to ready, while the
key itself is made in the key worker (agent/sds/keywork.py); cryptography is loaded in this
process only when a later key or a file-mounted secret needs it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

SPIFFE_SCHEME = "spiffe://"


class KeyType(enum.StrEnum):
    EC_P256 = "ec-p256"
    RSA_2048 = "rsa-2048"


def spiffe_id(trust_domain: str, namespace: str, service_account: str) -> str:
    """`spiffe://<trust domain>/ns/<ns>/sa/<sa>`, Istio's workload identity."""
    for what, value in (
        ("trust domain", trust_domain),
        ("namespace", namespace),
        ("service account", service_account),
    ):
        if not value or "/" in value:
            raise ValueError(f"invalid {what} for a SPIFFE ID: {value!r}")
    return f"{SPIFFE_SCHEME}{trust_domain}/ns/{namespace}/sa/{service_account}"


@dataclass(frozen=True, slots=True, eq=False)
class KeyAndCsr:
    """A new private key and the CSR signed with it, PEM."""

    key_pem: bytes  # PKCS#8, unencrypted: Envoy reads it from inline bytes
    csr_pem: bytes
