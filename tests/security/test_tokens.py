"""Forged and stale bearer tokens against CreateCertificate (TLS and plaintext ports) and ADS
on the TLS port: every one is UNAUTHENTICATED. Each test first shows a genuine token getting
through on the same channels, so a refusal is the server's verdict on the token, not a
connection that never reached it."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import grpc
from cryptography.hazmat.primitives import serialization

from control.app import ControlPlane
from control.ca.authn import TokenIssuer, load_or_create_token_key
from tests.security.common import (
    SLEEP,
    ads_status,
    ca_status,
    cds_request,
    plain_channel,
    tls_channel,
    token,
)

UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _claims(now: float | None = None) -> dict[str, Any]:
    """Claims exactly as the control plane issues them for default/sleep."""
    now = time.time() if now is None else now
    return {
        "iss": "pilotfish",
        "sub": SLEEP.subject,
        "aud": ["istio-ca"],
        "iat": int(now),
        "nbf": int(now),
        "exp": int(now + 3600),
        "kubernetes.io": {"namespace": "default", "serviceaccount": {"name": "sleep"}},
    }


def _jwt(header: dict[str, Any], claims: dict[str, Any], sign: Any) -> str:
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    return f"{signing_input}.{_b64(sign(signing_input.encode()))}"


def _metric(cp: ControlPlane, name: str, labels: dict[str, str] | None = None) -> float:
    return cp.metrics.registry.get_sample_value(name, labels or {}) or 0.0


async def _assert_refused_everywhere(cp: ControlPlane, forged: str) -> None:
    """The forged token is UNAUTHENTICATED on CreateCertificate (TLS and plaintext ports) and
    on ADS over the TLS port; a genuine one passes on the same channels."""
    ca_fails = _metric(cp, "citadel_server_authentication_failure_count_total")
    xds_fails = _metric(cp, "pilotfish_xds_auth_failures_total", {"code": "UNAUTHENTICATED"})
    first = cds_request().SerializeToString()
    async with tls_channel(cp, cp.secure_xds_port) as tls, plain_channel(cp.xds_port) as plain:
        assert await ca_status(tls, token(cp)) is grpc.StatusCode.OK
        assert await ads_status(tls, first, token(cp)) is grpc.StatusCode.OK
        assert await ca_status(tls, forged) is UNAUTHENTICATED
        assert await ca_status(plain, forged) is UNAUTHENTICATED
        assert await ads_status(tls, first, forged) is UNAUTHENTICATED
    # The server itself counted the refusals (the calls reached it).
    assert _metric(cp, "citadel_server_authentication_failure_count_total") == ca_fails + 2
    assert (
        _metric(cp, "pilotfish_xds_auth_failures_total", {"code": "UNAUTHENTICATED"})
        == xds_fails + 1
    )


async def test_alg_none_token_is_unauthenticated(cp: ControlPlane) -> None:
    forged = _jwt({"alg": "none", "typ": "JWT"}, _claims(), lambda _: b"")
    await _assert_refused_everywhere(cp, forged)


async def test_hs256_signed_with_the_public_key_is_unauthenticated(cp: ControlPlane) -> None:
    """Key confusion: HMAC keyed with the verifier's own public key (PEM, as a naive library
    that takes "the key" for any algorithm would use it)."""
    assert cp.tokens is not None
    public_pem = cp.tokens.key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    forged = _jwt(
        {"alg": "HS256", "typ": "JWT"},
        _claims(),
        lambda data: hmac.new(public_pem, data, hashlib.sha256).digest(),
    )
    await _assert_refused_everywhere(cp, forged)


async def test_expired_token_is_unauthenticated(cp: ControlPlane) -> None:
    assert cp.tokens is not None
    # Signed with the right key; expired an hour ago (far beyond the clock-skew leeway).
    forged = cp.tokens.issue(SLEEP, 60, time.time() - 3600)
    await _assert_refused_everywhere(cp, forged)


async def test_wrong_audience_token_is_unauthenticated(cp: ControlPlane) -> None:
    assert cp.tokens is not None
    forged = TokenIssuer(cp.tokens.key, audience="some-other-service").issue(
        SLEEP, 3600, time.time()
    )
    await _assert_refused_everywhere(cp, forged)


async def test_wrong_issuer_token_is_unauthenticated(cp: ControlPlane) -> None:
    assert cp.tokens is not None
    forged = TokenIssuer(cp.tokens.key, issuer="https://evil.example").issue(
        SLEEP, 3600, time.time()
    )
    await _assert_refused_everywhere(cp, forged)


async def test_token_of_another_control_plane_is_unauthenticated(
    cp: ControlPlane, tmp_path: Path
) -> None:
    """A token `pilotfish-ctl token --state-dir OTHER` prints: right claims, other key."""
    other = load_or_create_token_key(tmp_path / "other-state")
    forged = TokenIssuer(other).issue(SLEEP, 3600, time.time())
    await _assert_refused_everywhere(cp, forged)
