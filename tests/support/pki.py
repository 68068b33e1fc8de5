"""Real keys, CSRs and CA hierarchies for tests (cryptography, nothing mocked)."""

from __future__ import annotations

import datetime as dt
import itertools
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey


def ec_key(curve: ec.EllipticCurve | None = None) -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(curve or ec.SECP256R1())


def key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_csr(key: PrivateKey | None = None, *, san: str = "", cn: str = "") -> bytes:
    """A CSR that may ask for any identity (the CA must ignore it)."""
    key = key or ec_key()
    b = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)] if cn else [])
    )
    if san:
        b = b.add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(san)]), critical=False
        )
    algo = None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    return b.sign(key, algo).public_bytes(serialization.Encoding.PEM)


def load_chain(pems: list[str]) -> list[x509.Certificate]:
    return [x509.load_pem_x509_certificate(p.encode()) for p in pems]


def spiffe_ids(cert: x509.Certificate) -> list[str]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return list(san.get_values_for_type(x509.UniformResourceIdentifier))


def verify_chain(chain: list[x509.Certificate]) -> None:
    """Each certificate is signed by the next; the last is a self-signed root."""
    for child, parent in itertools.pairwise(chain):
        child.verify_directly_issued_by(parent)
    chain[-1].verify_directly_issued_by(chain[-1])


def ca_cert(
    name: str,
    key: PrivateKey,
    issuer: tuple[x509.Certificate, PrivateKey] | None = None,
    *,
    days: int = 365,
    is_ca: bool = True,
) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    issuer_name, signer = (issuer[0].subject, issuer[1]) if issuer else (subject, key)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .sign(signer, hashes.SHA256())  # type: ignore[arg-type]
    )


def write_intermediate_ca(d: Path) -> tuple[Path, Path, Path, x509.Certificate]:
    """root -> intermediate, written as files: (intermediate cert, its key, chain file with
    the intermediate and the root, as Istio's cert-chain.pem lays it out; and the root)."""
    root_key, int_key = ec_key(), ec_key()
    root = ca_cert("test root", root_key)
    inter = ca_cert("test intermediate", int_key, (root, root_key))
    d.mkdir(parents=True, exist_ok=True)
    (d / "ca-cert.pem").write_bytes(cert_pem(inter))
    (d / "ca-key.pem").write_bytes(key_pem(int_key))
    (d / "cert-chain.pem").write_bytes(cert_pem(inter) + cert_pem(root))
    return d / "ca-cert.pem", d / "ca-key.pem", d / "cert-chain.pem", root
