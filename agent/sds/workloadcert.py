"""The workload certificate as the agent serves it: checked from the CA's answer against our
key and split into chain, key and root; and the counters of issuing it (with an observer for
the agent's metrics)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from agent.sds.signer import SigningError


@dataclass(frozen=True, slots=True, eq=False)
class WorkloadCert:
    """A signed workload certificate as served."""

    chain_pem: bytes  # leaf first, then intermediates (the root is served as ROOTCA)
    key_pem: bytes
    root_pem: bytes
    serial: int
    not_before: float  # wall-clock seconds
    not_after: float
    identity: str | None  # the leaf's SPIFFE URI SAN

    @property
    def serial_hex(self) -> str:
        """As Envoy's admin /certs shows it: lowercase hex, whole bytes."""
        h = format(self.serial, "x")
        return h if len(h) % 2 == 0 else "0" + h


class SdsObserver(Protocol):
    """Where certificate events go besides the plain counters (the agent's metrics)."""

    def sign_attempt(self) -> None: ...
    def cert_issued(self, not_after: float, *, rotation: bool) -> None: ...
    def signing_failed(self, *, retryable: bool) -> None: ...
    def file_secret_failed(self) -> None: ...


@dataclass(eq=False)
class SdsStats:
    """Counters of certificate signing and file-mounted secrets."""

    sign_attempts: int = 0
    certs_issued: int = 0
    rotations: int = 0  # certificates issued after the first
    signing_failures: int = 0
    file_secret_failures: int = 0
    observer: SdsObserver | None = None

    def on_attempt(self) -> None:
        self.sign_attempts += 1
        if self.observer is not None:
            self.observer.sign_attempt()

    def on_issued(self, not_after: float) -> None:
        rotation = self.certs_issued > 0
        self.certs_issued += 1
        self.rotations += rotation
        if self.observer is not None:
            self.observer.cert_issued(not_after, rotation=rotation)

    def on_failure(self, retryable: bool) -> None:
        self.signing_failures += 1
        if self.observer is not None:
            self.observer.signing_failed(retryable=retryable)

    def on_file_failure(self) -> None:
        self.file_secret_failures += 1
        if self.observer is not None:
            self.observer.file_secret_failed()


def workload_cert(chain: list[str], key_pem: bytes, root_pem: bytes | None) -> WorkloadCert:
    """Check a signed chain against our key and split it into what is served (blocking).

    SigningError (retryable: the next attempt may get a proper answer) when the CA's answer
    is unusable.
    """
    if not chain:
        raise SigningError("the CA returned an empty certificate chain")
    try:
        certs = [x509.load_pem_x509_certificate(p.encode()) for p in chain]
    except ValueError as e:
        raise SigningError(f"the CA returned an invalid certificate: {e}") from e
    leaf = certs[0]
    key = serialization.load_pem_private_key(key_pem, password=None)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if leaf.public_key().public_bytes(
        serialization.Encoding.DER, spki
    ) != key.public_key().public_bytes(serialization.Encoding.DER, spki):
        raise SigningError("the CA's certificate is not for our key")
    served = certs
    if len(certs) > 1:
        served = certs[:-1]  # the contract: root last; it is ROOTCA, not part of the chain
        if root_pem is None:
            root_pem = certs[-1].public_bytes(serialization.Encoding.PEM)
    elif root_pem is None:
        raise SigningError(
            "the CA returned no root certificate and no root file is configured",
            retryable=False,
        )
    identity: str | None = None
    with contextlib.suppress(x509.ExtensionNotFound):
        uris = leaf.extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        ).value.get_values_for_type(x509.UniformResourceIdentifier)
        identity = next((u for u in uris if u.startswith("spiffe://")), None)
    return WorkloadCert(
        chain_pem=b"".join(c.public_bytes(serialization.Encoding.PEM) for c in served),
        key_pem=key_pem,
        root_pem=root_pem,
        serial=leaf.serial_number,
        not_before=leaf.not_valid_before_utc.timestamp(),
        not_after=leaf.not_valid_after_utc.timestamp(),
        identity=identity,
    )


def checked_cert(chain: list[str], key_pem: bytes, root_file: Path | None) -> WorkloadCert:
    root_pem: bytes | None = None
    if root_file is not None:
        try:
            root_pem = root_file.read_bytes()
            if not x509.load_pem_x509_certificates(root_pem):
                raise ValueError("no certificate")
        except (OSError, ValueError) as e:
            raise SigningError(f"root certificate file {root_file}: {e}") from e
    return workload_cert(chain, key_pem, root_pem)
