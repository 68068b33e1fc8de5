"""Who may read the debug views (`--debug-allow`), as Istio's `ENABLE_DEBUG_ON_HTTP=false`.

The views show every proxy's node metadata, generated config and the mesh config (and the
dashboard at `/ui/` shows the same and more), so off loopback they are for the mesh's
operators only: `/debug/*` (and `/ui/*`) on a non-loopback
`--http-address` needs `Authorization: Bearer <token>` of an identity in `--debug-allow`
(default: the control plane's own namespace, `istio-system/*`). `/ready` and `/metrics`
stay open (probes and scrapers carry no token). On a loopback address everything stays open
for local use. syncz over xDS on the TLS ports (whose streams are authenticated already)
shows an allowed caller every stream and any other caller the streams of its own namespace.

Sans-IO: `DebugPolicy.decide` takes the path and the Authorization headers and returns
`Allow` or `Deny(status, reason)`, asking an injected `verify` (the Authenticator the gRPC
side uses) about tokens; `visible_syncz` is a pure filter. `debug_middleware` is the aiohttp
adapter that DebugServer installs.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from control.ca.authn import AuthError, Denial
from control.ca.grpcauth import CallAuthenticator
from control.ca.identity import Identity, IdentityError

logger = logging.getLogger(__name__)

# Istio's control-plane namespace; ours when nothing says otherwise.
DEFAULT_NAMESPACE = "istio-system"
# Open whatever the address: kubelet probes and Prometheus scrapes carry no token. Anything
# else needs a token off loopback (not only /debug/*: a path the router would map onto a
# debug view some other way, or a view added later, is then closed rather than open).
OPEN_PATHS = frozenset({"/ready", "/metrics"})


class DebugAllowError(ValueError):
    """A `--debug-allow` entry that is not NS/SA or NS/*."""


@dataclass(frozen=True, slots=True)
class AllowRule:
    namespace: str
    service_account: str | None  # None: every service account of the namespace (NS/*)

    def matches(self, identity: Identity) -> bool:
        return identity.namespace == self.namespace and self.service_account in (
            None,
            identity.service_account,
        )

    def __str__(self) -> str:
        return f"{self.namespace}/{self.service_account or '*'}"


@dataclass(frozen=True, slots=True)
class DebugAllow:
    """The identities `--debug-allow` names."""

    rules: tuple[AllowRule, ...]

    @classmethod
    def parse(cls, text: str) -> DebugAllow:
        """`NS/SA,NS/*,…`; DebugAllowError naming the first malformed entry."""
        entries = [e.strip() for e in text.split(",")]
        if not any(entries):
            raise DebugAllowError("names no identity (want NS/SA or NS/*, comma-separated)")
        rules = []
        for entry in entries:
            namespace, sep, account = entry.partition("/")
            if not sep or not namespace or not account:
                raise DebugAllowError(f"{entry!r} is not NS/SA or NS/*")
            try:
                # Identity checks both names (DNS-1123); "x" stands in for "*".
                Identity(namespace, "x" if account == "*" else account)
            except IdentityError as e:
                raise DebugAllowError(f"{entry!r}: {e}") from None
            rules.append(AllowRule(namespace, None if account == "*" else account))
        return cls(tuple(dict.fromkeys(rules)))

    @classmethod
    def namespace(cls, namespace: str) -> DebugAllow:
        return cls((AllowRule(namespace, None),))

    def allows(self, identity: Identity) -> bool:
        return any(rule.matches(identity) for rule in self.rules)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.rules)


def own_namespace(kubernetes: bool, environ: Mapping[str, str]) -> str:
    """The control plane's namespace: its pod's (POD_NAMESPACE, from the downward API) in
    Kubernetes mode; file mode has no namespace of its own, so Istio's."""
    if kubernetes:
        return environ.get("POD_NAMESPACE", "").strip() or DEFAULT_NAMESPACE
    return DEFAULT_NAMESPACE


def is_loopback(address: str) -> bool:
    """Whether HOST:PORT binds only loopback (127.0.0.0/8, ::1, localhost). Any other name
    counts as not loopback: what it resolves to is not ours to trust."""
    host = address.rpartition(":")[0].strip("[]").lower()
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # 3.11 does not call ::ffff:127.0.0.1 loopback
    return ip.is_loopback


@dataclass(frozen=True, slots=True)
class Allow:
    identity: Identity | None = None  # None: no token was needed


@dataclass(frozen=True, slots=True)
class Deny:
    status: int  # 401: no or bad credentials; 403: a verified identity not allowed
    reason: str  # one line, for the caller


# A token check: the identity the Authorization headers name, or AuthError.
Verify = Callable[[Sequence[str]], Awaitable[Identity]]

_NO_TOKEN = (
    "debug views need 'Authorization: Bearer <token>' of an identity in --debug-allow "
    "(pilotfish-ctl token; pilotfish-ctl proxy-config --token-file)"
)


@dataclass(frozen=True, slots=True)
class DebugPolicy:
    allow: DebugAllow
    requires_auth: bool  # False on a loopback --http-address

    async def decide(self, path: str, authorization: Sequence[str], verify: Verify) -> Allow | Deny:
        if not self.requires_auth or path in OPEN_PATHS:
            return Allow()
        if not authorization:
            return Deny(401, _NO_TOKEN)
        try:
            identity = await verify(authorization)
        except AuthError as e:
            # A client certificate is never asked for here, so every AuthError is about the
            # token: 401, whatever the denial (a 403 would say the token was good).
            return Deny(401, e.message)
        if not self.allows(identity):
            return Deny(403, f"{identity} may not read debug views (not in --debug-allow)")
        return Allow(identity)

    def allows(self, identity: Identity) -> bool:
        return self.allow.allows(identity)

    def visible_syncz(
        self, entries: list[dict[str, Any]], caller: Identity | None
    ) -> list[dict[str, Any]]:
        """The syncz entries a caller of syncz over xDS may see: all of them for an allowed
        caller and on the plaintext port (caller None: local use, as /debug/* on loopback);
        for any other authenticated caller, the streams of proxies in its own namespace."""
        if caller is None or self.allows(caller):
            return entries
        return [e for e in entries if e.get("namespace") == caller.namespace]


class PolicyOptions(Protocol):
    """What the policy is made of (control.app.ControlPlaneOptions)."""

    @property
    def debug_allow(self) -> DebugAllow | None: ...
    @property
    def debug_requires_auth(self) -> bool | None: ...
    @property
    def http_address(self) -> str: ...
    @property
    def kubernetes(self) -> bool: ...


def debug_policy(options: PolicyOptions, environ: Mapping[str, str] = os.environ) -> DebugPolicy:
    """`debug_allow` None is the control plane's own namespace, `debug_requires_auth` None is
    judged by `http_address`."""
    allow = options.debug_allow or DebugAllow.namespace(own_namespace(options.kubernetes, environ))
    requires_auth = options.debug_requires_auth
    if requires_auth is None:
        requires_auth = not is_loopback(options.http_address)
    if requires_auth:
        logger.info("/debug/* needs a bearer token of %s (--debug-allow)", allow)
    return DebugPolicy(allow, requires_auth)


def debug_middleware(
    policy: DebugPolicy,
    authenticator: Callable[[], CallAuthenticator | None],
    clock: Callable[[], float] = time.time,
) -> Middleware:
    """The aiohttp middleware for DebugServer. `authenticator` is asked per request (the
    control plane creates it in start(), after the HTTP server object exists). Tokens go
    through `authenticate_async`, as on the gRPC side: our own ES256 check (well under a
    millisecond, remembered until the token expires) or TokenReview over the async client,
    nothing that blocks the event loop."""

    async def verify(authorization: Sequence[str]) -> Identity:
        auth = authenticator()
        if auth is None:
            raise AuthError(Denial.UNAUTHENTICATED, "the control plane is not ready")
        return await auth.authenticator.authenticate_async(authorization, None, clock())

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        verdict = await policy.decide(
            request.path, request.headers.getall("Authorization", []), verify
        )
        if isinstance(verdict, Deny):
            log = logger.info if verdict.status == 403 else logger.debug
            log(
                "%s %s from %s: %d %s",
                request.method,
                request.path,
                request.remote,
                verdict.status,
                verdict.reason,
            )
            headers = {"WWW-Authenticate": 'Bearer realm="pilotfish"'}
            return web.Response(
                status=verdict.status,
                text=verdict.reason + "\n",
                headers=headers if verdict.status == 401 else None,
            )
        return await handler(request)

    return guard
