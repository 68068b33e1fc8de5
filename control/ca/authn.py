"""Who is calling: bearer JWTs the control plane signs (file mode) and client certificates
issued by our own CA. Sans-IO: token bytes or a peer certificate and `now` in, an `Identity`
or an `AuthError` out; the gRPC adapter (control/ca/grpcauth.py) extracts those from a call.

Tokens are ES256 JWTs, implemented here with `cryptography` (no JWT library: the format is
three base64url parts, and a verifier that accepts exactly one algorithm cannot be talked into
`alg: none` or HMAC-with-the-public-key). Claims follow Kubernetes service-account tokens:
`iss`, `sub` = `system:serviceaccount:<ns>:<sa>`, `aud`, `iat`, `nbf`, `exp`, and a
`kubernetes.io` object with the namespace and service account. Only `sub` decides the
identity.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import (
    decode_dss_signature,
    encode_dss_signature,
)

from control.ca.identity import Identity, IdentityError, parse_spiffe_id

logger = logging.getLogger(__name__)

TOKEN_KEY_FILE = "token-key.pem"
ISSUER = "pilotfish"
AUDIENCE = "istio-ca"  # what Istio's agents ask for by default
LEEWAY = 30.0  # seconds of clock skew tolerated for exp/nbf/iat
_MAX_TOKEN = 8192
_CACHE_SIZE = 4096


class Denial(enum.Enum):
    UNAUTHENTICATED = "UNAUTHENTICATED"  # no credentials, or ones we cannot verify
    PERMISSION_DENIED = "PERMISSION_DENIED"  # verified, but not allowed what it asks


class AuthError(Exception):
    def __init__(self, denial: Denial, message: str) -> None:
        super().__init__(message)
        self.denial = denial
        self.message = message


def _unauthenticated(message: str) -> AuthError:
    return AuthError(Denial.UNAUTHENTICATED, message)


# --- tokens --------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def key_id(public_key: ec.EllipticCurvePublicKey) -> str:
    spki = public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(spki).hexdigest()[:16]


class TokenIssuer:
    """Signs ES256 service-account tokens with the control plane's token key."""

    def __init__(
        self, key: ec.EllipticCurvePrivateKey, issuer: str = ISSUER, audience: str = AUDIENCE
    ) -> None:
        if key.curve.name != "secp256r1":
            raise ValueError("ES256 needs a P-256 key")
        self.key = key
        self.issuer = issuer
        self.audience = audience
        self._header = _b64(
            json.dumps(
                {"alg": "ES256", "typ": "JWT", "kid": key_id(key.public_key())},
                separators=(",", ":"),
            ).encode()
        )

    def issue(self, identity: Identity, ttl: float, now: float) -> str:
        claims = {
            "iss": self.issuer,
            "sub": identity.subject,
            "aud": [self.audience],
            "iat": int(now),
            "nbf": int(now),
            "exp": int(now + ttl),
            "kubernetes.io": {
                "namespace": identity.namespace,
                "serviceaccount": {"name": identity.service_account},
            },
        }
        signing_input = f"{self._header}.{_b64(json.dumps(claims, separators=(',', ':')).encode())}"
        der = self.key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256()))
        r, s = decode_dss_signature(der)
        return f"{signing_input}.{_b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    def verifier(self) -> TokenVerifier:
        return TokenVerifier(self.key.public_key(), self.issuer, self.audience)


class TokenVerifier:
    """Checks a token's signature and claims; returns the identity it names."""

    def __init__(
        self,
        public_key: ec.EllipticCurvePublicKey,
        issuer: str = ISSUER,
        audience: str = AUDIENCE,
        leeway: float = LEEWAY,
    ) -> None:
        self.public_key = public_key
        self.issuer = issuer
        self.audience = audience
        self.leeway = leeway

    def verify(self, token: str, now: float) -> tuple[Identity, float]:
        """(identity, expiry) or AuthError(UNAUTHENTICATED) saying what is wrong."""
        if len(token) > _MAX_TOKEN:
            raise _unauthenticated("token is too long")
        parts = token.split(".")
        if len(parts) != 3:
            raise _unauthenticated("token is not a JWT (header.payload.signature)")
        try:
            header = json.loads(_unb64(parts[0]))
            claims = json.loads(_unb64(parts[1]))
            signature = _unb64(parts[2])
        except (ValueError, binascii.Error):
            raise _unauthenticated("token is not a JWT (bad base64url or JSON)") from None
        if not isinstance(header, dict) or header.get("alg") != "ES256":
            alg = header.get("alg") if isinstance(header, dict) else None
            raise _unauthenticated(f"token algorithm {alg!r} is not accepted (ES256 only)")
        if len(signature) != 64:
            raise _unauthenticated("token signature has the wrong length for ES256")
        der = encode_dss_signature(
            int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")
        )
        try:
            self.public_key.verify(
                der, f"{parts[0]}.{parts[1]}".encode(), ec.ECDSA(hashes.SHA256())
            )
        except InvalidSignature:
            raise _unauthenticated(
                "token signature is not valid (not signed by this control plane)"
            ) from None
        if not isinstance(claims, dict):
            raise _unauthenticated("token claims are not a JSON object")
        return self._check_claims(claims, now)

    def _check_claims(self, claims: dict[str, Any], now: float) -> tuple[Identity, float]:
        exp = claims.get("exp")
        if not isinstance(exp, int | float) or isinstance(exp, bool):
            raise _unauthenticated("token has no expiry (exp)")
        if now >= exp + self.leeway:
            raise _unauthenticated(f"token expired {int(now - exp)}s ago")
        for claim in ("nbf", "iat"):
            t = claims.get(claim)
            if isinstance(t, int | float) and t > now + self.leeway:
                raise _unauthenticated(f"token is not valid yet ({claim} is in the future)")
        if claims.get("iss") != self.issuer:
            raise _unauthenticated(f"token issuer {claims.get('iss')!r} is not {self.issuer!r}")
        aud = claims.get("aud")
        audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
        if self.audience not in audiences:
            raise _unauthenticated(f"token audience {aud!r} does not include {self.audience!r}")
        sub = claims.get("sub")
        if not isinstance(sub, str):
            raise _unauthenticated("token has no subject (sub)")
        try:
            return Identity.from_subject(sub), float(exp)
        except IdentityError as e:
            raise _unauthenticated(f"token subject: {e}") from None


# --- the authenticator ---------------------------------------------------------------------


class Authenticator:
    """Turns what a caller presented into an identity.

    A client certificate (already verified against our root by the TLS layer) wins over a
    token; otherwise exactly one `Bearer` token is expected. Verified tokens are remembered
    until they expire, so a busy caller costs one signature check, not one per call."""

    def __init__(
        self,
        verifier: TokenVerifier,
        trust_domain: str,
        reviewer: TokenReviewer | None = None,
    ) -> None:
        self.verifier = verifier
        self.trust_domain = trust_domain
        # Kubernetes mode: tokens our key did not sign are asked about (TokenReview).
        self.reviewer = reviewer
        self._tokens: dict[str, tuple[Identity, float]] = {}
        self._certs: dict[bytes, Identity | AuthError] = {}

    def authenticate(
        self, authorization: Sequence[str], peer_cert_pem: bytes | None, now: float
    ) -> Identity:
        if peer_cert_pem:
            return self._from_cert(peer_cert_pem)
        token = _bearer(authorization)
        cached = self._cached(token, now)
        if cached is not None:
            return cached
        identity, exp = self.verifier.verify(token, now)
        self._remember(token, identity, exp)
        return identity

    async def authenticate_async(
        self, authorization: Sequence[str], peer_cert_pem: bytes | None, now: float
    ) -> Identity:
        """`authenticate`, and when our own key did not sign the token and a reviewer is set
        (Kubernetes mode), the answer of the reviewer (remembered until it expires)."""
        if self.reviewer is None or peer_cert_pem:
            return self.authenticate(authorization, peer_cert_pem, now)
        token = _bearer(authorization)
        cached = self._cached(token, now)
        if cached is not None:
            return cached
        try:
            identity, exp = self.verifier.verify(token, now)
        except AuthError as own:
            try:
                identity, exp = await self.reviewer.review(token, now)
            except AuthError as reviewed:
                raise _unauthenticated(
                    f"{reviewed.message} (and not one of ours: {own.message})"
                ) from None
        self._remember(token, identity, exp)
        return identity

    def _cached(self, token: str, now: float) -> Identity | None:
        cached = self._tokens.get(token)
        if cached is None:
            return None
        identity, exp = cached
        if now < exp + self.verifier.leeway:
            return identity
        del self._tokens[token]
        return None

    def _remember(self, token: str, identity: Identity, exp: float) -> None:
        if len(self._tokens) >= _CACHE_SIZE:
            self._tokens.clear()
        self._tokens[token] = (identity, exp)

    def _from_cert(self, pem: bytes) -> Identity:
        found = self._certs.get(pem)
        if found is None:
            found = self._identity_of_cert(pem)
            if len(self._certs) >= _CACHE_SIZE:
                self._certs.clear()
            self._certs[pem] = found
        if isinstance(found, AuthError):
            raise found
        return found

    def _identity_of_cert(self, pem: bytes) -> Identity | AuthError:
        try:
            cert = x509.load_pem_x509_certificate(pem)
            sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            uris = sans.get_values_for_type(x509.UniformResourceIdentifier)
        except (ValueError, x509.ExtensionNotFound):
            uris = []
        denied = AuthError(
            Denial.PERMISSION_DENIED, "client certificate names no workload SPIFFE identity"
        )
        for uri in uris:
            try:
                domain, identity = parse_spiffe_id(uri)
            except IdentityError:
                continue
            if domain != self.trust_domain:
                return AuthError(
                    Denial.PERMISSION_DENIED,
                    f"client certificate is for trust domain {domain!r}, not {self.trust_domain!r}",
                )
            return identity
        return denied


def _bearer(authorization: Sequence[str]) -> str:
    if not authorization:
        raise _unauthenticated(
            "no credentials: send 'authorization: Bearer <token>' (pilotfish-ctl token) "
            "or a client certificate issued by this control plane"
        )
    if len(authorization) > 1:
        raise _unauthenticated("more than one authorization header")
    scheme, _, token = authorization[0].strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthenticated("authorization header is not 'Bearer <token>'")
    return token.strip()


class TokenReviewer(Protocol):
    """Validates a token elsewhere (Kubernetes TokenReview): (identity, valid until) or
    AuthError."""

    async def review(self, token: str, now: float) -> tuple[Identity, float]: ...


def check_claim(identity: Identity, namespace: str, service_account: str) -> None:
    """A proxy may only claim its own identity (node metadata NAMESPACE / SERVICE_ACCOUNT)."""
    if (namespace, service_account) != (identity.namespace, identity.service_account):
        raise AuthError(
            Denial.PERMISSION_DENIED,
            f"caller {identity} may not connect as {namespace}/{service_account}",
        )


# --- the token key -------------------------------------------------------------------------


def load_or_create_token_key(state_dir: str | os.PathLike[str]) -> ec.EllipticCurvePrivateKey:
    """The P-256 token key in `state_dir` (0600), created when missing (blocking I/O).

    Creation is race-free (`pilotfish-ctl token` and the control plane may both get there
    first): the key is written to a private temporary file and hard-linked into place, which
    fails when another writer won; then the winner's key is read."""
    d = Path(state_dir)
    path = d / TOKEN_KEY_FILE
    if not path.exists():
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        fd, name = tempfile.mkstemp(prefix=f".{TOKEN_KEY_FILE}.", dir=d)  # 0600
        tmp = Path(name)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(pem)
            try:
                os.link(tmp, path)
                logger.info("created token signing key %s", path)
            except FileExistsError:
                pass
        finally:
            tmp.unlink(missing_ok=True)
    try:
        loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: not an unencrypted PEM private key: {e}") from None
    if not isinstance(loaded, ec.EllipticCurvePrivateKey) or loaded.curve.name != "secp256r1":
        raise ValueError(f"{path}: the token key must be an ECDSA P-256 key")
    return loaded
