"""Gateway API hostname rules: a listener hostname against a route hostname.

A wildcard `*.example.com` stands for one or more labels before `example.com` (not for
`example.com` itself); an empty listener hostname accepts every route hostname.
"""

from __future__ import annotations


def _covers(wildcard: str, host: str) -> bool:
    """`*.example.com` covers `a.example.com`, `a.b.example.com` and `*.a.example.com`."""
    suffix = wildcard[1:]  # ".example.com"
    return host.endswith(suffix) and len(host) > len(suffix)


def intersect(listener: str, route: str) -> str | None:
    """The hostnames both accept, as the more specific of the two; None when disjoint."""
    if not listener or listener == route:
        return route
    if route.startswith("*."):
        if listener.startswith("*."):
            if _covers(route, listener):
                return listener
            return route if _covers(listener, route) else None
        return listener if _covers(route, listener) else None
    if listener.startswith("*."):
        return route if _covers(listener, route) else None
    return None


def route_hosts(listener: str, route: tuple[str, ...]) -> tuple[str, ...]:
    """The hosts a route serves on a listener: the intersections of its hostnames with the
    listener's (the listener's own hostname, or `*`, when the route names none)."""
    if not route:
        return (listener or "*",)
    out: list[str] = []
    for name in route:
        got = intersect(listener, name)
        if got is not None and got not in out:
            out.append(got)
    return tuple(out)
