"""VirtualService delegation (Istio's `http[].delegate`), sans-IO.

A root VirtualService (one with hosts) may hand a route over to a delegate VirtualService
(one without hosts, in any namespace that exports it to the root's): the route is replaced,
in place, by the delegate's routes, each narrowed to the root route's match conditions and
inheriting the root route's settings it does not set itself, as Istio merges them
(`mergeHTTPRoutes`, `mergeHTTPMatchRequests`, `hasConflict`). Delegates never apply on their
own. The merge is done once per config snapshot (control/config/merge.py), so every index and
generator sees plain root VirtualServices, and an edit of a delegate alone changes the value
of the roots that use it: what pushes carry by a VirtualService's identity
(control/model/vs_carry.py) is then translated again for those roots only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import TypeVar

from control.model.traffic import (
    Delegate,
    HeaderMatch,
    HttpMatch,
    HttpRoute,
    MatchKind,
    StringMatch,
    VirtualService,
    exported_to,
)
from control.model.types import ConfigWarning, labels_of

_T = TypeVar("_T")


def merge_delegates(
    services: Sequence[VirtualService],
) -> tuple[list[VirtualService], list[ConfigWarning]]:
    """The VirtualServices that apply on their own (delegates left out), with every
    delegating route of a root replaced by its delegate's routes; a warning for each route
    that could not be resolved (it is dropped) and each delegate route whose match lies
    outside the root route's (dropped, as Istio drops it)."""
    delegates = {vs.key: vs for vs in services if not vs.hosts}
    by_key = {vs.key: vs for vs in services}
    out: list[VirtualService] = []
    warnings: list[ConfigWarning] = []
    for vs in services:
        if not vs.hosts:
            continue
        if not takes_part(vs):
            out.append(vs)
            continue
        http: list[HttpRoute] = []
        for route in vs.http:
            if route.delegate is None:
                http.append(route)
                continue
            found = _resolve(vs, route.delegate, delegates, by_key, warnings)
            if found is not None:
                http.extend(_merge_routes(vs, route, found, warnings))
        out.append(replace(vs, http=tuple(http)))
    return out, warnings


def takes_part(vs: VirtualService) -> bool:
    """Whether `vs` is a delegate or delegates a route (a config without any such needs no
    merge)."""
    return not vs.hosts or any(route.delegate is not None for route in vs.http)


def _resolve(
    root: VirtualService,
    ref: Delegate,
    delegates: dict[tuple[str, str], VirtualService],
    by_key: dict[tuple[str, str], VirtualService],
    warnings: list[ConfigWarning],
) -> VirtualService | None:
    """The delegate `ref` names, when the root may use it (else a warning, and None)."""
    name = f"{ref.namespace}/{ref.name}"
    found = delegates.get(ref.key)
    if found is None:
        why = (
            "has hosts, so it is not a delegate (a delegate has no hosts and no gateways)"
            if ref.key in by_key
            else "does not exist"
        )
        problem = f"delegate VirtualService {name} {why}"
    elif not exported_to(found.export_to, found.namespace, root.namespace):
        problem = f"delegate VirtualService {name} is not exported to namespace {root.namespace}"
    else:
        return found
    warnings.append(ConfigWarning(root.source, f"{problem}; the route delegating to it is ignored"))
    return None


def _merge_routes(
    root: VirtualService,
    route: HttpRoute,
    delegate: VirtualService,
    warnings: list[ConfigWarning],
) -> list[HttpRoute]:
    out: list[HttpRoute] = []
    for i, leaf in enumerate(delegate.http):
        matches = _merge_matches(route.matches, leaf.matches)
        if matches is None:
            warnings.append(
                ConfigWarning(
                    delegate.source,
                    f"route {leaf.name or f'#{i}'} of delegate VirtualService "
                    f"{delegate.namespace}/{delegate.name} matches outside the route of "
                    f"{root.namespace}/{root.name} that delegates to it; this route is "
                    "ignored there",
                )
            )
            continue
        out.append(_inherit(route, leaf, matches))
    return out


def _inherit(root: HttpRoute, leaf: HttpRoute, matches: tuple[HttpMatch, ...]) -> HttpRoute:
    """The delegate's route with the root route's settings it leaves unset (Istio's
    mergeHTTPRoute; the action — destinations, redirect, direct response — is the
    delegate's own)."""
    return replace(
        leaf,
        name=_joined(root.name, leaf.name),
        matches=matches,
        rewrite=_first(leaf.rewrite, root.rewrite),
        timeout=_first(leaf.timeout, root.timeout),
        retries=_first(leaf.retries, root.retries),
        fault=_first(leaf.fault, root.fault),
        cors=_first(leaf.cors, root.cors),
        # The model cannot tell an unset percentage from 100: it goes with its mirror.
        mirror=_first(leaf.mirror, root.mirror),
        mirror_percent=root.mirror_percent if leaf.mirror is None else leaf.mirror_percent,
        headers=leaf.headers or root.headers,
        delegate=None,
    )


def _merge_matches(
    roots: tuple[HttpMatch, ...], leaves: tuple[HttpMatch, ...]
) -> tuple[HttpMatch, ...] | None:
    """Istio's mergeHTTPMatchRequests: every delegate match combined with each root match
    it fits in; None (a conflict) when one fits in none."""
    if not roots:
        return leaves
    if not leaves:
        return roots
    out: list[HttpMatch] = []
    for leaf in leaves:
        fitting = [_merge_match(root, leaf) for root in roots if not _conflict(root, leaf)]
        if not fitting:
            return None
        out.extend(fitting)
    return tuple(out)


def _merge_match(root: HttpMatch, leaf: HttpMatch) -> HttpMatch:
    return HttpMatch(
        name=_joined(root.name, leaf.name),
        uri=_first(leaf.uri, root.uri),
        ignore_uri_case=leaf.ignore_uri_case,
        method=_first(leaf.method, root.method),
        authority=_first(leaf.authority, root.authority),
        scheme=_first(leaf.scheme, root.scheme),
        headers=_by_name(root.headers, leaf.headers, _header_key),
        query_params=_by_name(root.query_params, leaf.query_params, lambda q: q[0]),
        port=_first(leaf.port, root.port),
        source_namespace=leaf.source_namespace or root.source_namespace,
        source_labels=labels_of({**dict(root.source_labels), **dict(leaf.source_labels)}),
        stat_prefix=leaf.stat_prefix or root.stat_prefix,
        gateways=leaf.gateways or root.gateways,
    )


def _conflict(root: HttpMatch, leaf: HttpMatch) -> bool:
    """Istio's hasConflict: whether the delegate's match can hold outside the root's."""
    pairs = (
        (root.uri, leaf.uri),
        (root.scheme, leaf.scheme),
        (root.method, leaf.method),
        (root.authority, leaf.authority),
    )
    if any(_string_conflict(a, b) for a, b in pairs):
        return True
    root_headers = {_header_key(h): h for h in root.headers}
    for h in leaf.headers:
        other = root_headers.get(_header_key(h))
        # A presence match (no value) fits with nothing else of the same name, as in Istio.
        if other is not None and (
            other.match is None or h.match is None or _string_conflict(other.match, h.match)
        ):
            return True
    root_query = dict(root.query_params)
    if any(_string_conflict(root_query.get(k), m) for k, m in leaf.query_params):
        return True
    if root.ignore_uri_case != leaf.ignore_uri_case:
        return True
    if root.port is not None and leaf.port is not None and root.port != leaf.port:
        return True
    if root.source_namespace and leaf.source_namespace != root.source_namespace:
        return True
    root_labels = dict(root.source_labels)
    if any(root_labels.get(k, v) != v for k, v in leaf.source_labels):
        return True
    return bool(root.gateways and leaf.gateways and not set(leaf.gateways) <= set(root.gateways))


def _string_conflict(root: StringMatch | None, leaf: StringMatch | None) -> bool:
    """Istio's stringMatchConflict: the leaf must match a subset of what the root matches
    (a regex on either side is only compatible with nothing set on the other)."""
    if root is None or leaf is None:
        return False
    if MatchKind.REGEX in (root.kind, leaf.kind):
        return True
    if root.kind is MatchKind.EXACT:
        return leaf.kind is not MatchKind.EXACT or leaf.value != root.value
    return not leaf.value.startswith(root.value)


def _header_key(h: HeaderMatch) -> tuple[str, bool]:
    # `headers` and `withoutHeaders` are separate maps in Istio's API.
    return (h.name, h.invert)


def _by_name(root: Iterable[_T], leaf: Iterable[_T], key: Callable[[_T], object]) -> tuple[_T, ...]:
    """Root conditions, each replaced by the delegate's of the same name, then the
    delegate's others (Istio merges these maps, the delegate winning)."""
    merged = {key(x): x for x in root}
    merged.update((key(x), x) for x in leaf)
    return tuple(merged.values())


def _first(value: _T | None, fallback: _T | None) -> _T | None:
    return fallback if value is None else value


def _joined(root: str, leaf: str) -> str:
    if not leaf:
        return root
    return f"{root}-{leaf}" if root else leaf
