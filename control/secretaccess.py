"""Who may fetch a gateway certificate (a `v1 Secret` served over SDS as `kubernetes://…`),
sans-IO: a stream's proxy, its authenticated identity, the requested names and the
ReferenceGrants in, a verdict out.

The rule (DESIGN "Gateways"): only a router (`Proxy.is_router`) whose **authenticated**
namespace is the Secret's namespace, or that a ReferenceGrant in the Secret's namespace lets
read it. The namespace comes from the stream's identity, never from node metadata; an
unauthenticated stream (the plaintext port) vouches for no one and gets nothing. Sidecars never
can: a Secret is an ingress certificate, not workload identity.

`ReferenceGrants` (control/model/secret.py) is the one question asked of Gateway API
ReferenceGrants (`MeshIndex.secret_grants`: the config's, `GatewayGrants`).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import grpc

from control.ca.identity import Identity
from control.model.index import MeshIndex
from control.model.proxy import Proxy
from control.model.secret import (
    NO_GRANTS,
    SDS_PREFIX,
    ReferenceGrants,
    SecretRef,
    parse_sds_name,
)
from control.xds.hooks import StreamRefused

logger = logging.getLogger(__name__)


class Verdict(enum.StrEnum):
    ALLOWED = "allowed"
    DENIED = "denied"  # PERMISSION_DENIED
    MALFORMED = "malformed"  # INVALID_ARGUMENT: not a name a Secret can be asked by


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    reason: str = ""
    ref: SecretRef | None = None
    namespace: str = ""  # the Secret's namespace, when the name parsed

    @property
    def allowed(self) -> bool:
        return self.verdict is Verdict.ALLOWED


def decide(
    resource: str,
    proxy: Proxy,
    identity: Identity | None,
    grants: ReferenceGrants = NO_GRANTS,
) -> Decision:
    """May this stream fetch the SDS resource `resource`?"""
    ref = parse_sds_name(resource)
    if ref is None:
        return Decision(
            Verdict.MALFORMED,
            f"{resource!r} is not a gateway certificate name ({SDS_PREFIX}<name>, "
            f"{SDS_PREFIX}<name>-cacert or {SDS_PREFIX}<namespace>/<name>)",
        )
    if identity is None:
        return Decision(
            Verdict.DENIED,
            f"{resource}: an unauthenticated stream may not fetch secrets (connect to the "
            "TLS port with a token)",
            ref,
        )
    if not proxy.is_router:
        return Decision(
            Verdict.DENIED,
            f"{resource}: only a gateway (router) may fetch secrets; {proxy.id} is a "
            f"{proxy.type or 'sidecar'}",
            ref,
        )
    own = identity.namespace
    if proxy.namespace != own:
        # The TLS port refuses such a stream already (security.py check_claim); kept so the
        # rule stands on its own.
        return Decision(
            Verdict.DENIED,
            f"{resource}: the node claims namespace {proxy.namespace}, the caller is {identity}",
            ref,
        )
    namespace = ref.namespace or own
    if namespace != own and not any(
        grants.allows_secret(own, namespace, name) for name in ref.candidates()
    ):
        return Decision(
            Verdict.DENIED,
            f"{resource}: a gateway in namespace {own} may not read Secrets of namespace "
            f"{namespace} (no ReferenceGrant allows it)",
            ref,
            namespace,
        )
    return Decision(Verdict.ALLOWED, "", ref, namespace)


def first_refusal(
    resources: Iterable[str],
    proxy: Proxy,
    identity: Identity | None,
    grants: ReferenceGrants = NO_GRANTS,
) -> Decision | None:
    """The decision for the first name (in sorted order) this stream may not fetch, or None
    when it may fetch them all. Subscribing to every secret (no names, or `*`) is refused:
    a router names the secrets its listeners use."""
    names = sorted(set(resources))
    if not names or "*" in names:
        return Decision(Verdict.DENIED, "secrets are fetched by name, never all at once")
    for name in names:
        d = decide(name, proxy, identity, grants)
        if not d.allowed:
            return d
    return None


class SecretGuard:
    """The xDS server's subscription guard for SDS (control/xds/hooks.py SubscriptionGuard):
    refuses the stream (PERMISSION_DENIED, or INVALID_ARGUMENT for a name no Secret can
    have) unless every name may be fetched, with the newest push's grants; warns once per
    proxy and name when an allowed name has no Secret (its listener waits for it; it is sent
    when the Secret appears)."""

    def __init__(self, index: Callable[[], MeshIndex], *, remember: int = 4096) -> None:
        self._index = index
        self._warned: set[tuple[str, str]] = set()
        self._remember = remember

    def __call__(self, proxy: Proxy, identity: Identity | None, names: Sequence[str]) -> None:
        index = self._index()
        refusal = first_refusal(names, proxy, identity, index.secret_grants)
        if refusal is not None:
            code = (
                grpc.StatusCode.INVALID_ARGUMENT
                if refusal.verdict is Verdict.MALFORMED
                else grpc.StatusCode.PERMISSION_DENIED
            )
            raise StreamRefused(code, refusal.reason)
        for name in names:
            ref = parse_sds_name(name)
            if ref is None or index.secrets.resolve(ref, proxy.namespace) is not None:
                continue
            if (proxy.id, name) in self._warned:
                continue
            if len(self._warned) >= self._remember:
                self._warned.clear()  # bounded: at worst a warning is repeated
            self._warned.add((proxy.id, name))
            candidates = " or ".join(
                f"{ref.namespace or proxy.namespace}/{c}" for c in ref.candidates()
            )
            logger.warning(
                "%s asks for %s: no Secret %s with %s (yet); it is sent once there is one",
                proxy.id,
                name,
                candidates,
                "ca.crt" if ref.ca else "tls.crt and tls.key",
            )


__all__ = [
    "NO_GRANTS",
    "Decision",
    "ReferenceGrants",
    "SecretGuard",
    "Verdict",
    "decide",
    "first_refusal",
]
