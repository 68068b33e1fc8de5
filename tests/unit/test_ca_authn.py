"""Authentication without sockets: tokens in, identity or a precise refusal out."""

from __future__ import annotations

import base64
import datetime as dt
import json
import stat
import threading
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from control.ca.authn import (
    Authenticator,
    AuthError,
    Denial,
    TokenIssuer,
    check_claim,
    load_or_create_token_key,
)
from control.ca.authority import in_memory_authority
from control.ca.identity import Identity, IdentityError, parse_spiffe_id
from control.duration import parse_duration
from tests.support.pki import make_csr

NOW = 2_000_000_000.0
SLEEP = Identity("default", "sleep")


@pytest.fixture(scope="module")
def issuer() -> TokenIssuer:
    return TokenIssuer(ec.generate_private_key(ec.SECP256R1()))


def auth(issuer: TokenIssuer) -> Authenticator:
    return Authenticator(issuer.verifier(), "cluster.local")


def bearer(token: str) -> list[str]:
    return [f"Bearer {token}"]


def refusal(a: Authenticator, headers: list[str], now: float = NOW) -> AuthError:
    with pytest.raises(AuthError) as e:
        a.authenticate(headers, None, now)
    return e.value


def test_token_round_trip_and_claims(issuer: TokenIssuer) -> None:
    token = issuer.issue(SLEEP, 3600, NOW)
    assert auth(issuer).authenticate(bearer(token), None, NOW + 10) == SLEEP
    claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    assert claims["sub"] == "system:serviceaccount:default:sleep"
    assert claims["kubernetes.io"]["serviceaccount"]["name"] == "sleep"
    assert claims["exp"] - claims["iat"] == 3600


def test_expired_token_is_unauthenticated(issuer: TokenIssuer) -> None:
    token = issuer.issue(SLEEP, 60, NOW)
    a = auth(issuer)
    assert a.authenticate(bearer(token), None, NOW + 30) == SLEEP  # cached now ...
    e = refusal(a, bearer(token), NOW + 3600)  # ... and the cache honours expiry
    assert e.denial is Denial.UNAUTHENTICATED and "expired" in e.message


def test_token_from_another_key_is_unauthenticated(issuer: TokenIssuer) -> None:
    other = TokenIssuer(ec.generate_private_key(ec.SECP256R1()))
    e = refusal(auth(issuer), bearer(other.issue(SLEEP, 60, NOW)))
    assert e.denial is Denial.UNAUTHENTICATED and "signature" in e.message


def test_tampered_claims_are_unauthenticated(issuer: TokenIssuer) -> None:
    head, payload, sig = issuer.issue(SLEEP, 60, NOW).split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["sub"] = "system:serviceaccount:kube-system:admin"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    assert "signature" in refusal(auth(issuer), bearer(f"{head}.{forged}.{sig}")).message


@pytest.mark.parametrize("alg", ["none", "HS256", "RS256"])
def test_other_algorithms_are_refused(issuer: TokenIssuer, alg: str) -> None:
    _, payload, sig = issuer.issue(SLEEP, 60, NOW).split(".")
    head = base64.urlsafe_b64encode(json.dumps({"alg": alg}).encode()).rstrip(b"=").decode()
    e = refusal(auth(issuer), bearer(f"{head}.{payload}.{sig if alg != 'none' else ''}"))
    assert "ES256 only" in e.message


def test_wrong_audience_and_issuer(issuer: TokenIssuer) -> None:
    key = issuer.key
    assert (
        "audience"
        in refusal(
            auth(issuer), bearer(TokenIssuer(key, audience="other").issue(SLEEP, 60, NOW))
        ).message
    )
    assert (
        "issuer"
        in refusal(
            auth(issuer), bearer(TokenIssuer(key, issuer="evil").issue(SLEEP, 60, NOW))
        ).message
    )


@pytest.mark.parametrize(
    ("headers", "match"),
    [
        ([], "no credentials"),
        (["Basic dXNlcjpwYXNz"], "not 'Bearer <token>'"),
        (["Bearer "], "not 'Bearer <token>'"),
        (["Bearer abc"], "not a JWT"),
        (["Bearer a.b.c"], "not a JWT"),
        (["Bearer x", "Bearer y"], "more than one"),
    ],
)
def test_missing_or_malformed_credentials(
    issuer: TokenIssuer, headers: list[str], match: str
) -> None:
    e = refusal(auth(issuer), headers)
    assert e.denial is Denial.UNAUTHENTICATED and match in e.message


def test_client_certificate_identity(issuer: TokenIssuer) -> None:
    ca = in_memory_authority("cluster.local")
    now = dt.datetime.now(dt.UTC)
    leaf = ca.sign_csr(make_csr(), Identity("shop", "cart"), 600, now)[0].encode()
    a = auth(issuer)
    # A certificate wins over a token (the TLS layer has verified it against our root).
    token = issuer.issue(SLEEP, 60, NOW)
    assert a.authenticate(bearer(token), leaf, NOW) == Identity("shop", "cart")
    foreign = in_memory_authority("other.org")
    other = foreign.sign_csr(make_csr(), SLEEP, 600, now)[0].encode()
    with pytest.raises(AuthError) as e:
        a.authenticate([], other, NOW)
    assert e.value.denial is Denial.PERMISSION_DENIED and "other.org" in e.value.message
    serving, _ = ca.issue_serving_cert(["localhost"], [], now)
    with pytest.raises(AuthError) as e:
        a.authenticate([], serving[0].encode(), NOW)
    assert e.value.denial is Denial.PERMISSION_DENIED and "no workload" in e.value.message


def test_a_proxy_may_only_claim_its_own_identity() -> None:
    check_claim(SLEEP, "default", "sleep")
    with pytest.raises(AuthError) as e:
        check_claim(SLEEP, "default", "admin")
    assert e.value.denial is Denial.PERMISSION_DENIED
    assert "default/sleep may not connect as default/admin" in e.value.message


def test_identity_names_cannot_smuggle_path_segments() -> None:
    for ns, sa in (("a/b", "x"), ("ns", "sa/../admin"), ("NS", "x"), ("", "x")):
        with pytest.raises(IdentityError):
            Identity(ns, sa)
    with pytest.raises(IdentityError):
        Identity.from_subject("system:serviceaccount:default")
    assert parse_spiffe_id("spiffe://td/ns/a/sa/b") == ("td", Identity("a", "b"))
    with pytest.raises(IdentityError):
        parse_spiffe_id("spiffe://td/ns/a/sa/b/extra")


def test_token_key_is_private_and_created_once_under_races(tmp_path: Path) -> None:
    d = tmp_path / "state"
    keys: list[ec.EllipticCurvePrivateKey] = []
    threads = [
        threading.Thread(target=lambda: keys.append(load_or_create_token_key(d))) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    numbers = {k.private_numbers().private_value for k in keys}
    assert len(keys) == 8 and len(numbers) == 1  # every racer ended up with the same key
    assert stat.S_IMODE((d / "token-key.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert [p.name for p in d.iterdir()] == ["token-key.pem"]  # no temporary files left


def test_durations() -> None:
    assert parse_duration("90s") == 90
    assert parse_duration("30m") == 1800
    assert parse_duration("1h") == 3600
    assert parse_duration("2d") == 172800
    assert parse_duration("15") == 15
    for bad in ("", "1w", "-1h", "0", "h"):
        with pytest.raises(ValueError):
            parse_duration(bad)
