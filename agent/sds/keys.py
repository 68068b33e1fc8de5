"""The workload's private key and CSR.

The key never leaves the agent: the CA sees only the CSR, whose URI SAN names the SPIFFE
identity we expect (the CA takes the identity from our credentials, not from the CSR, but a
CSR that states it is what Istio's agent sends and what other CAs expect). Key generation
is CPU-bound (RSA takes tens of milliseconds), so the async entry point runs it in a thread.
"""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from agent.sds.keyspec import SPIFFE_SCHEME, KeyAndCsr, KeyType, spiffe_id

# Named here too: the module that makes keys is where a reader looks for them.
__all__ = [
    "SPIFFE_SCHEME",
    "KeyAndCsr",
    "KeyType",
    "generate_key_and_csr",
    "new_key_and_csr",
    "spiffe_id",
]


def generate_key_and_csr(identity: str, key_type: KeyType = KeyType.EC_P256) -> KeyAndCsr:
    """A fresh key and a CSR for `identity` (a SPIFFE URI). Blocking; see `new_key_and_csr`."""
    if not identity.startswith(SPIFFE_SCHEME):
        raise ValueError(f"identity must be a SPIFFE URI, got {identity!r}")
    key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
    if key_type is KeyType.EC_P256:
        key = ec.generate_private_key(ec.SECP256R1())
    elif key_type is KeyType.RSA_2048:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    else:  # pragma: no cover - StrEnum exhausts the cases
        raise ValueError(f"unsupported key type {key_type!r}")
    # The identity lives in the SAN; the subject carries only the trust domain as the
    # organization (as Istio's agent does), so the SAN need not be critical.
    trust_domain = identity.removeprefix(SPIFFE_SCHEME).partition("/")[0]
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, trust_domain)]))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(identity)]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    return KeyAndCsr(
        key_pem=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        csr_pem=csr.public_bytes(serialization.Encoding.PEM),
    )


async def new_key_and_csr(identity: str, key_type: KeyType = KeyType.EC_P256) -> KeyAndCsr:
    """`generate_key_and_csr` off the event loop."""
    import asyncio  # here: the key workers (agent/sds/workerproc.py) have no event loop

    return await asyncio.to_thread(generate_key_and_csr, identity, key_type)
