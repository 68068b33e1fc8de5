"""Kubernetes `v1 Secret` -> model TlsSecret (gateway certificates, served over SDS).

Types `kubernetes.io/tls` and `Opaque`; keys `tls.crt` (the chain, leaf first), `tls.key` and
an optional `ca.crt`, base64 in `data` or plain in `stringData` (which wins, as the API
server merges it). The chain and key must parse and belong together, `ca.crt` must hold
certificates. Secrets of other types (service-account tokens, registry credentials) and
Opaque ones without certificate keys are not gateway certificates: they are skipped
silently, as in a cluster most Secrets are of that sort.

Nothing here ever echoes key material: errors name the key and say what is wrong, and the
object kept for /debug/configz has every value of `data` and `stringData` redacted.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Mapping
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from control.config import formats
from control.config.fields import Context, Fields
from control.config.kinds.common import envelope_of
from control.config.objects import ConfigObject
from control.model.secret import TlsSecret

logger = logging.getLogger(__name__)

API_VERSIONS = ("v1",)

TLS_TYPE = "kubernetes.io/tls"
OPAQUE_TYPE = "Opaque"
CERT_KEY, KEY_KEY, CA_KEY = "tls.crt", "tls.key", "ca.crt"
REDACTED = "<redacted>"


def convert(ctx: Context, domain: str) -> ConfigObject:
    obj = ctx.obj
    root = envelope_of(ctx, formats.dns1123_subdomain)
    secret_type = root.get_str("type", default=OPAQUE_TYPE)
    values = _values(root)
    root.ignore("immutable")
    root.finish()
    redacted = redact(obj.data)
    if secret_type not in (TLS_TYPE, OPAQUE_TYPE):
        logger.debug("%s: type %s is not a gateway certificate; skipped", obj.label, secret_type)
        return ConfigObject(ctx.source, redacted)
    cert, key, ca = (values.get(k) for k in (CERT_KEY, KEY_KEY, CA_KEY))
    if secret_type == TLS_TYPE:
        for name, value in ((CERT_KEY, cert), (KEY_KEY, key)):
            if value is None:
                ctx.fail(("data",), f"{name} is required in a Secret of type {TLS_TYPE}")
    if cert is not None and key is not None and not cert[1] and not key[1]:
        # Both keys empty: a certificate not issued yet (cert-manager creates its Secrets
        # so). Served once it is there; until then the Secret has no certificate.
        cert = key = None
    if cert is None and key is None and ca is None:
        return ConfigObject(ctx.source, redacted)  # an Opaque Secret of some other use
    if (cert is None) != (key is None):
        missing = KEY_KEY if key is None else CERT_KEY
        ctx.fail(("data",), f"{missing} is required with {KEY_KEY if cert is None else CERT_KEY}")
    chain, private = (cert[1], key[1]) if cert is not None and key is not None else (b"", b"")
    if cert is not None and key is not None:
        _check_pair(ctx, cert, key)
    if ca is not None:
        _certificates(ctx, ca, CA_KEY)
    secret = TlsSecret(
        namespace=obj.namespace,
        name=obj.name,
        source=ctx.source,
        cert_chain=chain,
        private_key=private,
        ca_cert=ca[1] if ca is not None else b"",
    )
    return ConfigObject(ctx.source, redacted, secrets=(secret,))


# (path for errors, decoded bytes) per key.
_Value = tuple[tuple[str, str], bytes]


def _values(root: Fields) -> dict[str, _Value]:
    out: dict[str, _Value] = {}
    for path, key, value in root.get_items("data"):
        if not isinstance(value, str):
            root.ctx.fail(path, "must be a base64 string")
        try:
            out[key] = (("data", key), base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError):
            root.ctx.fail(path, "is not valid base64")
    for path, key, value in root.get_items("stringData"):
        if not isinstance(value, str):
            root.ctx.fail(path, "must be a string")
        out[key] = (("stringData", key), value.encode())
    return out


def _certificates(ctx: Context, value: _Value, what: str) -> list[x509.Certificate]:
    path, data = value
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        ctx.fail(path, f"{what} holds no valid PEM certificate")
    if not certs:
        ctx.fail(path, f"{what} holds no PEM certificate")
    return certs


def _check_pair(ctx: Context, cert: _Value, key: _Value) -> None:
    leaf = _certificates(ctx, cert, CERT_KEY)[0]
    try:
        # Skipping RSA's consistency check (40 ms per 2048-bit key, and Kubernetes mode
        # converts on the event loop): only the public half is compared here, and the TLS
        # library that serves the key checks it again when it loads it.
        private = serialization.load_pem_private_key(
            key[1], password=None, unsafe_skip_rsa_key_validation=True
        )
    except TypeError:
        ctx.fail(key[0], f"{KEY_KEY} is encrypted; give an unencrypted PEM key")
    except (ValueError, binascii.Error):
        ctx.fail(key[0], f"{KEY_KEY} holds no valid PEM private key")
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if leaf.public_key().public_bytes(*spki) != private.public_key().public_bytes(*spki):
        ctx.fail(key[0], f"{KEY_KEY} does not belong to the first certificate of {CERT_KEY}")


def redact(data: Mapping[str, Any]) -> dict[str, Any]:
    """The object with every value of `data` and `stringData` replaced (for configz)."""
    out = dict(data)
    for field in ("data", "stringData"):
        values = out.get(field)
        if isinstance(values, Mapping):
            out[field] = {str(k): REDACTED for k in values}
        elif values is not None:
            out[field] = REDACTED
    return out
