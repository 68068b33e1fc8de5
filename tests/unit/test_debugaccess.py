"""The debug-access decision (control/debugaccess.py), without sockets: --debug-allow
parsing, the loopback judgement, decide() with a fake verifier, and the syncz filter."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from control.ca.authn import AuthError, Denial
from control.ca.identity import Identity
from control.debugaccess import (
    Allow,
    AllowRule,
    DebugAllow,
    DebugAllowError,
    DebugPolicy,
    Deny,
    debug_policy,
    is_loopback,
    own_namespace,
)

ISTIOD = Identity("istio-system", "istiod")
OPS = Identity("ops", "admin")
SHOP = Identity("shop", "web")
DEFAULT_ALLOW = DebugAllow.namespace("istio-system")


# --- --debug-allow --------------------------------------------------------------------------


def test_parse_allow_list() -> None:
    allow = DebugAllow.parse(" istio-system/* , ops/admin,ops/admin")
    assert allow.rules == (AllowRule("istio-system", None), AllowRule("ops", "admin"))
    assert str(allow) == "istio-system/*,ops/admin"
    assert allow.allows(ISTIOD) and allow.allows(OPS)
    assert not allow.allows(Identity("ops", "other"))
    assert not allow.allows(SHOP)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "names no identity"),
        (" , ", "names no identity"),
        ("istio-system", "'istio-system' is not NS/SA or NS/*"),
        ("istio-system/", "is not NS/SA or NS/*"),
        ("/sa", "is not NS/SA or NS/*"),
        ("ops/admin,,shop/web", "'' is not NS/SA or NS/*"),
        ("*/*", "namespace '*' is not a DNS-1123 label"),
        ("Ops/admin", "namespace 'Ops' is not a DNS-1123 label"),
        ("ops/ad/min", "service account 'ad/min' is not a DNS-1123 subdomain"),
        ("ops/a*", "service account 'a*'"),
    ],
)
def test_malformed_allow_list_is_one_line(text: str, message: str) -> None:
    with pytest.raises(DebugAllowError) as e:
        DebugAllow.parse(text)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_default_is_own_namespace() -> None:
    assert own_namespace(False, {"POD_NAMESPACE": "mesh"}) == "istio-system"  # file mode
    assert own_namespace(True, {"POD_NAMESPACE": "mesh"}) == "mesh"
    assert own_namespace(True, {}) == "istio-system"


@dataclass(frozen=True)
class _Opts:
    debug_allow: DebugAllow | None = None
    debug_requires_auth: bool | None = None
    http_address: str = "127.0.0.1:15014"
    kubernetes: bool = False


def test_debug_policy_from_options() -> None:
    env = {"POD_NAMESPACE": "mesh"}
    assert debug_policy(_Opts(), env) == DebugPolicy(DEFAULT_ALLOW, False)
    assert debug_policy(_Opts(http_address="0.0.0.0:15014"), env).requires_auth
    assert debug_policy(_Opts(kubernetes=True), env).allow == DebugAllow.namespace("mesh")
    forced = debug_policy(_Opts(debug_requires_auth=True, debug_allow=DebugAllow.parse("a/b")))
    assert forced == DebugPolicy(DebugAllow.parse("a/b"), True)
    assert not debug_policy(
        _Opts(http_address="10.0.0.1:1", debug_requires_auth=False)
    ).requires_auth


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:15014", True),
        ("127.1.2.3:0", True),
        ("[::1]:15014", True),
        ("localhost:15014", True),
        ("LOCALHOST:1", True),
        ("[::ffff:127.0.0.1]:1", True),
        ("0.0.0.0:15014", False),
        ("[::]:15014", False),
        ("10.0.0.5:15014", False),
        ("[::ffff:10.0.0.5]:1", False),
        ("istiod.istio-system.svc:15014", False),
        ("localhost.example.com:1", False),
        (":15014", False),  # all interfaces
    ],
)
def test_loopback_is_judged_by_address(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


# --- decide() -------------------------------------------------------------------------------


class FakeVerifier:
    """Tokens "good:<ns>:<sa>" verify; anything else is refused as the Authenticator would."""

    def __init__(self) -> None:
        self.calls: list[Sequence[str]] = []

    async def __call__(self, authorization: Sequence[str]) -> Identity:
        self.calls.append(authorization)
        if len(authorization) != 1:
            raise AuthError(Denial.UNAUTHENTICATED, "more than one authorization header")
        scheme, _, token = authorization[0].partition(" ")
        if scheme.lower() != "bearer":
            raise AuthError(Denial.UNAUTHENTICATED, "authorization header is not 'Bearer <token>'")
        if not token.startswith("good:"):
            raise AuthError(Denial.UNAUTHENTICATED, "token signature is not valid")
        _, ns, sa = token.split(":", 2)
        return Identity(ns, sa)


OFF_LOOPBACK = DebugPolicy(DebugAllow.parse("istio-system/*,ops/admin"), requires_auth=True)


@pytest.mark.parametrize("path", ["/ready", "/metrics"])
async def test_probes_and_metrics_are_open(path: str) -> None:
    verify = FakeVerifier()
    assert await OFF_LOOPBACK.decide(path, [], verify) == Allow()
    assert verify.calls == []


@pytest.mark.parametrize(
    "path", ["/debug/syncz", "/debug/config_dump", "/debug/", "/ready/", "/metrics2", "/x", "/"]
)
async def test_everything_else_needs_a_token(path: str) -> None:
    verdict = await OFF_LOOPBACK.decide(path, [], FakeVerifier())
    assert isinstance(verdict, Deny) and verdict.status == 401
    assert "Authorization: Bearer" in verdict.reason and "\n" not in verdict.reason


async def test_loopback_is_open_without_asking() -> None:
    verify = FakeVerifier()
    open_policy = DebugPolicy(OFF_LOOPBACK.allow, requires_auth=False)
    assert await open_policy.decide("/debug/syncz", [], verify) == Allow()
    assert await open_policy.decide("/debug/syncz", ["Bearer junk"], verify) == Allow()
    assert verify.calls == []


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        (["Bearer junk"], "token signature is not valid"),
        (["Basic dXNlcjpwYXNz"], "not 'Bearer <token>'"),
        (["Bearer good:istio-system:istiod", "Bearer x"], "more than one authorization header"),
    ],
)
async def test_bad_credentials_are_401(headers: list[str], reason: str) -> None:
    verdict = await OFF_LOOPBACK.decide("/debug/syncz", headers, FakeVerifier())
    assert isinstance(verdict, Deny) and verdict.status == 401
    assert reason in verdict.reason


async def test_permission_denied_from_the_verifier_is_still_401() -> None:
    """A client certificate is never asked for over HTTP: whatever the Authenticator says is
    about the token, and a 403 would tell the caller the token was good."""

    async def refuse(authorization: Sequence[str]) -> Identity:
        raise AuthError(Denial.PERMISSION_DENIED, "nope")

    assert await OFF_LOOPBACK.decide("/debug/syncz", ["Bearer t"], refuse) == Deny(401, "nope")


async def test_allowed_identity_passes_and_others_are_403() -> None:
    verify = FakeVerifier()
    ok = await OFF_LOOPBACK.decide("/debug/syncz", ["Bearer good:istio-system:istiod"], verify)
    assert ok == Allow(ISTIOD)
    ok = await OFF_LOOPBACK.decide("/debug/configz", ["bearer good:ops:admin"], verify)
    assert ok == Allow(OPS)
    denied = await OFF_LOOPBACK.decide("/debug/syncz", ["Bearer good:ops:intern"], verify)
    assert denied == Deny(403, "ops/intern may not read debug views (not in --debug-allow)")


# --- syncz over xDS -------------------------------------------------------------------------


def _entries() -> list[dict[str, Any]]:
    return [
        {"proxy": "sidecar~10.0.0.1~a.shop~shop.svc.cluster.local", "namespace": "shop"},
        {"proxy": "sidecar~10.0.0.2~b.bank~bank.svc.cluster.local", "namespace": "bank"},
        {"proxy": "sidecar~10.0.0.3~c.shop~shop.svc.cluster.local", "namespace": "shop"},
    ]


def test_syncz_allowed_caller_sees_every_stream() -> None:
    assert OFF_LOOPBACK.visible_syncz(_entries(), ISTIOD) == _entries()
    assert OFF_LOOPBACK.visible_syncz(_entries(), OPS) == _entries()


def test_syncz_other_caller_sees_its_own_namespace() -> None:
    seen = OFF_LOOPBACK.visible_syncz(_entries(), SHOP)
    assert [e["proxy"].split("~")[1] for e in seen] == ["10.0.0.1", "10.0.0.3"]
    assert OFF_LOOPBACK.visible_syncz(_entries(), Identity("other", "x")) == []


def test_syncz_unauthenticated_stream_is_the_plaintext_port() -> None:
    """The plaintext port serves anyone for local use, as /debug/* on loopback: unchanged."""
    assert OFF_LOOPBACK.visible_syncz(_entries(), None) == _entries()
