"""The CA's answer checked against our key and split into what is served (chain, key, root),
with cryptography: in the key worker for the first certificate (agent/sds/keywork.py), in a
thread of the agent's process for later ones."""

from __future__ import annotations

import contextlib
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from agent.sds.signer import SigningError
from agent.sds.workloadcert import WorkloadCert


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
