"""File-mounted certificates, named as Istio's agent names them: `file-cert:<cert>~<key>`
serves a certificate chain and key from two files, `file-root:<ca>` a root bundle. Reading
and validating is blocking (the caller runs it in a thread); watching is polling by the
secret manager, which compares the bytes so that atomic symlink swaps (Kubernetes secret
volumes) and same-second rewrites are both noticed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from agent.sds.names import FILE_CERT_PREFIX as FILE_CERT_PREFIX
from agent.sds.names import FILE_ROOT_PREFIX as FILE_ROOT_PREFIX
from agent.sds.names import FileSecretError, file_resource_paths
from agent.sds.names import is_file_resource as is_file_resource
from agent.sds.resources import SecretEntry, tls_certificate, validation_context


@dataclass(frozen=True, slots=True)
class FileCert:
    cert: Path
    key: Path

    @property
    def paths(self) -> tuple[Path, ...]:
        return (self.cert, self.key)


@dataclass(frozen=True, slots=True)
class FileRoot:
    ca: Path

    @property
    def paths(self) -> tuple[Path, ...]:
        return (self.ca,)


FileSource = FileCert | FileRoot


def parse_file_resource(name: str) -> FileSource:
    """The files behind a `file-cert:`/`file-root:` name; FileSecretError if malformed."""
    paths = file_resource_paths(name)
    if len(paths) == 2:
        return FileCert(Path(paths[0]), Path(paths[1]))
    return FileRoot(Path(paths[0]))


def read_contents(source: FileSource) -> tuple[bytes, ...]:
    """The raw bytes of the source's files (blocking)."""
    try:
        return tuple(p.read_bytes() for p in source.paths)
    except OSError as e:
        raise FileSecretError(f"cannot read {e.filename}: {e.strerror}") from e


def build_entry(name: str, source: FileSource, contents: tuple[bytes, ...]) -> SecretEntry:
    """Validate the files' contents and make the secret (blocking: parses certificates)."""
    if isinstance(source, FileCert):
        chain, key = contents
        certs = _certs(chain, source.cert)
        try:
            private = serialization.load_pem_private_key(key, password=None)
        except (ValueError, TypeError) as e:
            raise FileSecretError(f"{source.key}: not an unencrypted PEM private key") from e
        if certs[0].public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        ) != private.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        ):
            # Usually a half-finished rotation (cert written, key not yet): wait for the key.
            raise FileSecretError(f"{source.key} does not match the certificate {source.cert}")
        return tls_certificate(name, chain, key)
    (ca,) = contents
    _certs(ca, source.ca)
    return validation_context(name, ca)


def _certs(data: bytes, path: Path) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as e:
        raise FileSecretError(f"{path}: no valid PEM certificate") from e
    if not certs:
        raise FileSecretError(f"{path}: no PEM certificate")
    return certs
