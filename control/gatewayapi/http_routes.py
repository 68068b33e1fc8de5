"""HTTPRoute and GRPCRoute rules as model HTTP routes on one Gateway port and host (sans-IO).

Each match of a rule is one model route carrying the listener's port; the routes of every
attached route for one (Gateway, port, host) are ordered by the Gateway API's precedence:
exact path, then longest prefix, a method, most headers, most query parameters, then the
oldest route, then namespace/name, then rule and match order.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from control.gatewayapi.backends import UNRESOLVED, unresolved
from control.model.gatewayapi import ApiRoute, RouteKind, RouteRule
from control.model.traffic import (
    Destination,
    Fault,
    HttpMatch,
    HttpRoute,
    MatchKind,
    Rewrite,
    StringMatch,
    VirtualService,
)
from control.model.types import SourceRef

_PATH_RANK = {MatchKind.EXACT: 0, MatchKind.REGEX: 1, MatchKind.PREFIX: 2}


@dataclass(frozen=True, slots=True)
class Attached:
    """One route rule match to serve on one (gateway, port, host)."""

    order: tuple[object, ...]
    route: HttpRoute


def rule_target(
    rule: RouteRule, dests: tuple[Destination, ...]
) -> tuple[tuple[Destination, ...], Fault | None]:
    """Where a rule sends traffic: its destinations, or, with nothing valid to send it to
    (reported as ResolvedRefs), the spec's 500."""
    if rule.redirect is None and all(unresolved(d) for d in dests):
        return dests or (Destination(f"no-backend{UNRESOLVED}"),), Fault(abort_status=500)
    return dests, None


def attached(
    route: ApiRoute,
    r: int,
    m: int,
    match: HttpMatch,
    port: int,
    target: tuple[tuple[Destination, ...], Fault | None],
    mirror: tuple[Destination | None, float],
) -> Attached:
    """Match `m` of rule `r` of `route` as served on `port`; `order[-5:]` names it."""
    rule = route.rules[r]
    dests, fault = target
    order = (*_precedence(match), route.created, route.namespace, route.name, r, m)
    return Attached(
        order,
        HttpRoute(
            name=f"{route.namespace}.{route.name}.{r}.{m}",
            matches=(_port_match(route, match, port),),
            destinations=dests,
            redirect=rule.redirect,
            rewrite=_rewrite(rule, match),
            timeout=rule.timeout,
            mirror=mirror[0],
            mirror_percent=mirror[1],
            headers=rule.headers,
            fault=fault,
        ),
    )


def http_virtual_service(
    key: tuple[str, str, int, str], items: Sequence[Attached], gateway_ref: str, source: SourceRef
) -> VirtualService:
    """The VirtualService of one (Gateway namespace, name, port, host), bound to it."""
    namespace, name, port, host = key
    label = "wildcard" if host == "*" else host.replace("*", "wildcard")
    return VirtualService(
        namespace=namespace,
        name=f"{name}-{port}-{label}",
        source=source,
        hosts=(host,),
        http=tuple(i.route for i in sorted(items, key=lambda i: i.order)),
        gateways=(gateway_ref,),
    )


def _precedence(match: HttpMatch) -> tuple[object, ...]:
    uri = match.uri or StringMatch(MatchKind.PREFIX, "/")
    return (
        _PATH_RANK[uri.kind],
        -len(uri.value),
        match.method is None,
        -len(match.headers),
        -len(match.query_params),
    )


def _port_match(route: ApiRoute, match: HttpMatch, port: int) -> HttpMatch:
    """The match as the model states it on one gateway port; a Gateway API PathPrefix is
    path-element-wise (`/foo` matches `/foo` and `/foo/…`, never `/foobar`)."""
    uri = match.uri
    if route.kind is RouteKind.HTTP and uri is not None and uri.kind is MatchKind.PREFIX:
        prefix = uri.value.rstrip("/")
        if prefix:
            uri = StringMatch(MatchKind.REGEX, f"{re.escape(prefix)}(/.*)?")
        else:
            uri = StringMatch(MatchKind.PREFIX, "/")
    return replace(match, uri=uri, port=port)


def _rewrite(rule: RouteRule, match: HttpMatch) -> Rewrite | None:
    if rule.replace_prefix is None:
        return rule.rewrite
    base = rule.rewrite or Rewrite()
    uri = match.uri
    replacement = rule.replace_prefix.rstrip("/")
    if uri is None or uri.kind is not MatchKind.PREFIX:
        return replace(base, uri_regex=("^/.*$", rule.replace_prefix))
    prefix = re.escape(uri.value.rstrip("/"))
    if not replacement:
        return replace(base, uri_regex=(f"^{prefix}/?", "/"))
    if not prefix:
        return replace(base, uri_regex=("^/", f"{replacement}/"))
    return replace(base, uri_regex=(f"^{prefix}", replacement))
