"""A real certificate authority for tests, built with `cryptography`: a self-signed root that
signs CSRs into short-lived SPIFFE certificates. It implements the agent's
`CertificateSigner` (async `sign`) so the secret manager gets real certificates, and it can
be told to fail the next attempts to exercise retries."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from agent.sds.signer import SigningError
from control.ca.authority import root_certificate


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


@dataclass(frozen=True)
class IssuedCert:
    cert_pem: bytes
    key_pem: bytes
    serial: int

    def write(self, directory: Path, stem: str) -> tuple[Path, Path]:
        cert, key = directory / f"{stem}.pem", directory / f"{stem}-key.pem"
        cert.write_bytes(self.cert_pem)
        key.write_bytes(self.key_pem)
        key.chmod(0o600)
        return cert, key


@dataclass
class TestCA:
    __test__ = False  # not a pytest class

    name: str = "pilotfish test root"
    # The identity every certificate gets (as a real CA takes it from the caller); None: the
    # CSR's own URI SAN.
    identity: str | None = None
    # Failures to raise on the next calls of `sign`, in order.
    failures: list[Exception] = field(default_factory=list)
    # Include the root at the end of the returned chain (the contract; False: leaf only).
    include_root: bool = True
    issued: list[int] = field(default_factory=list)  # serials, in order
    calls: int = 0
    ttls: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, self.name)])
        self.root = root_certificate(
            self.key, subject, now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)
        )
        self.root_pem = _pem(self.root).encode()

    # --- CertificateSigner -----------------------------------------------------------------

    async def sign(self, csr_pem: bytes, ttl_seconds: int) -> list[str]:
        self.calls += 1
        self.ttls.append(ttl_seconds)
        if self.failures:
            raise self.failures.pop(0)
        return await asyncio.to_thread(self.sign_csr, csr_pem, ttl_seconds)

    # --- blocking helpers ------------------------------------------------------------------

    def sign_csr(self, csr_pem: bytes, ttl_seconds: float) -> list[str]:
        csr = x509.load_pem_x509_csr(csr_pem)
        if not csr.is_signature_valid:
            raise SigningError("CSR signature is invalid", retryable=False)
        uris: Sequence[str] = []
        try:
            san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            uris = san.get_values_for_type(x509.UniformResourceIdentifier)
        except x509.ExtensionNotFound:
            pass
        identity = self.identity or (uris[0] if uris else None)
        if identity is None:
            raise SigningError("CSR has no identity", retryable=False)
        cert = self._leaf(csr.public_key(), identity, ttl_seconds)
        chain = [_pem(cert)]
        if self.include_root:
            chain.append(_pem(self.root))
        return chain

    def client_cert(self, identity: str, ttl_seconds: float = 3600) -> IssuedCert:
        """A key and certificate for a TLS client (or server) outside the agent."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = self._leaf(key.public_key(), identity, ttl_seconds)
        return IssuedCert(
            cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
            cert.serial_number,
        )

    def server_cert(self, dns_names: Sequence[str], ttl_seconds: float = 3600) -> IssuedCert:
        """A key and certificate for an HTTPS server outside the mesh: DNS SANs, no SPIFFE
        identity (what TLS origination towards an external host verifies)."""
        key = ec.generate_private_key(ec.SECP256R1())
        san = x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names])
        cert = self._leaf(key.public_key(), "", ttl_seconds, san)
        return IssuedCert(
            cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
            cert.serial_number,
        )

    def _leaf(
        self,
        public_key: CertificatePublicKeyTypes,
        identity: str,
        ttl_seconds: float,
        san: x509.SubjectAlternativeName | None = None,
    ) -> x509.Certificate:
        now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        serial = x509.random_serial_number()
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([]))
            .issuer_name(self.root.subject)
            .public_key(public_key)
            .serial_number(serial)
            .not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(seconds=ttl_seconds))
            .add_extension(
                san or x509.SubjectAlternativeName([x509.UniformResourceIdentifier(identity)]),
                critical=True,
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        self.issued.append(serial)
        return cert
