"""Istio `VirtualService` -> model VirtualService (HTTP, TCP and TLS routes).

`gateways` binds it as Istio does: absent means sidecars only (`mesh`); `ns/name` or a bare
name (the VirtualService's namespace) names a Gateway, and `mesh` must then be listed to keep
sidecars. `match[].gateways` narrows one match. Which part applies where is decided by
`control.model.traffic.bound_to`. A match condition we cannot honour is reported and its
match is dropped, so the route matches less, never more. `sourceLabels` selects the client
sidecar's workload labels, and at a gateway the router pod's own, as in Istio.
"""

from __future__ import annotations

from control.config import formats
from control.config.fields import Context, Fields
from control.config.kinds.common import (
    ISTIO_NETWORKING_VERSIONS,
    check_host,
    export_to,
    resolve_host,
    spec_of,
)
from control.config.kinds.http_actions import (
    parse_cors,
    parse_direct_response,
    parse_fault,
    parse_headers,
    parse_redirect,
    parse_retries,
    parse_rewrite,
    string_match,
    string_match_at,
)
from control.config.manifest import format_path
from control.config.objects import ConfigObject
from control.model.gateway import MESH_GATEWAY
from control.model.rule_lookup import host_matches
from control.model.traffic import (
    Delegate,
    Destination,
    HeaderMatch,
    HttpMatch,
    HttpRoute,
    StringMatch,
    TcpRoute,
    TlsRoute,
    VirtualService,
)
from control.model.types import labels_of

API_VERSIONS = ISTIO_NETWORKING_VERSIONS


class _Resolver:
    def __init__(self, namespace: str, domain: str) -> None:
        self.namespace = namespace
        self.domain = domain

    def __call__(self, host: str) -> str:
        return resolve_host(host, self.namespace, self.domain)


def convert(ctx: Context, domain: str) -> ConfigObject:
    obj = ctx.obj
    spec = spec_of(ctx, formats.dns1123_subdomain)
    resolve = _Resolver(obj.namespace, domain)
    hosts: list[str] = []
    for path, host in spec.get_strs("hosts"):
        check_host(spec, path, host)
        resolved = resolve(host)
        if resolved not in hosts:
            hosts.append(resolved)
    # Istio: a VirtualService without hosts is a delegate, applied only through the roots
    # that delegate to it, so whatever would bind it on its own is an error.
    is_delegate = not hosts
    if is_delegate:
        for key in ("gateways", "tcp", "tls"):
            if spec.has(key):
                spec.fail(key, "must not be set in a delegate VirtualService (one without hosts)")
    gateways = _gateways(spec, "gateways", obj.namespace) or (MESH_GATEWAY,)
    http = tuple(
        r
        for item in spec.get_maps("http")
        if (r := _http_route(item, resolve, is_delegate)) is not None
    )
    tcp = tuple(_tcp_route(item, resolve) for item in spec.get_maps("tcp"))
    tls = tuple(_tls_route(item, resolve, tuple(hosts)) for item in spec.get_maps("tls"))
    exports = export_to(spec)
    spec.finish()
    if not any(spec.has(k) for k in ("http", "tcp", "tls")):
        spec.fail(None, "needs http, tcp or tls routes")
    vs = VirtualService(
        namespace=obj.namespace,
        name=obj.name,
        source=ctx.source,
        hosts=tuple(hosts),
        http=http,
        tcp=tcp,
        tls=tls,
        export_to=exports,
        gateways=gateways,
    )
    return ConfigObject(ctx.source, obj.data, virtual_services=(vs,))


def _gateways(f: Fields, key: str, namespace: str) -> tuple[str, ...]:
    """Gateway names resolved as Istio resolves them: `mesh`, `ns/name`, or a bare name in
    the VirtualService's namespace; () when absent."""
    out: list[str] = []
    for path, value in f.get_strs(key):
        if value == MESH_GATEWAY:
            ref = value
        else:
            ns, slash, name = value.rpartition("/")
            if not slash:
                ns = namespace
            elif ns == ".":
                ns = namespace
            if problem := formats.dns1123_label(ns):
                f.ctx.fail(path, f"gateway namespace {ns!r} {problem}")
            if problem := formats.dns1123_subdomain(name):
                f.ctx.fail(path, f"gateway name {name!r} {problem}")
            ref = f"{ns}/{name}"
        if ref not in out:
            out.append(ref)
    return tuple(out)


# --- HTTP ------------------------------------------------------------------------------------


def _http_route(f: Fields, resolve: _Resolver, in_delegate: bool) -> HttpRoute | None:
    name = f.get_str("name")
    delegate = _delegate(f, resolve.namespace, in_delegate)
    matches: list[HttpMatch] = []
    items = f.get_maps("match")
    for item in items:
        match = _http_match(item, resolve.namespace)
        if match is not None:
            matches.append(match)
    if items and not matches:
        f.ctx.warn(f"{format_path(f.path)}: no match condition is usable; route ignored")
        return None
    destinations = tuple(_destination(item, resolve) for item in f.get_maps("route"))
    _check_weights(f, destinations)
    redirect = parse_redirect(f.get_map("redirect"))
    direct = parse_direct_response(f.get_map("directResponse"))
    # Istio's rules: a redirect or a direct response is the route's whole action.
    for action, present in (("redirect", redirect), ("directResponse", direct)):
        if present is not None:
            for other in ("route", "redirect", "directResponse", "fault", "rewrite"):
                if other != action and f.has(other):
                    f.fail(action, f"cannot be combined with {other}")
    if redirect is None and direct is None and not destinations and delegate is None:
        f.fail("route", "is required (or a redirect, or a directResponse)")
    mirror = None
    mirror_f = f.get_map("mirror")
    if mirror_f is not None:
        mirror = _destination_fields(mirror_f, resolve)
        mirror_f.finish()
    mirror_percent = f.get_percent("mirrorPercentage")
    if mirror_percent is None:
        legacy = f.get_int("mirrorPercent", maximum=100)
        mirror_percent = 100.0 if legacy is None else float(legacy)
    if f.has("mirrors"):
        f.ctx.warn_unsupported(f.at("mirrors"), "(use mirror)")
        f.ignore("mirrors")
    route = HttpRoute(
        name=name,
        matches=tuple(matches),
        destinations=destinations,
        redirect=redirect,
        direct_response=direct,
        cors=parse_cors(f.get_map("corsPolicy")),
        rewrite=parse_rewrite(f.get_map("rewrite")),
        timeout=f.get_duration("timeout"),
        retries=parse_retries(f.get_map("retries")),
        fault=parse_fault(f.get_map("fault")),
        mirror=mirror,
        mirror_percent=mirror_percent,
        headers=parse_headers(f.get_map("headers")),
        delegate=delegate,
    )
    f.finish()
    return route


def _delegate(f: Fields, namespace: str, in_delegate: bool) -> Delegate | None:
    """`delegate`, checked as Istio validates it: one level only, and a delegating route
    has no action of its own (the delegate's routes bring theirs)."""
    d = f.get_map("delegate")
    if d is None:
        return None
    if in_delegate:
        f.fail("delegate", "a delegate VirtualService's routes cannot delegate again")
    for action in ("route", "redirect", "directResponse"):
        if f.has(action):
            f.fail(action, "cannot be combined with delegate (the delegate's routes act)")
    name = d.get_str("name", required=True)
    if problem := formats.dns1123_subdomain(name):
        d.fail("name", f"{name!r} {problem}")
    ns = d.get_str("namespace") or namespace
    if problem := formats.dns1123_label(ns):
        d.fail("namespace", f"{ns!r} {problem}")
    d.finish()
    return Delegate(name, ns)


def _http_match(f: Fields, namespace: str) -> HttpMatch | None:
    gateways = _gateways(f, "gateways", namespace)
    headers: list[HeaderMatch] = []
    for path, key, value in f.get_items("headers"):
        headers.append(HeaderMatch(key.lower(), string_match_at(f, path, value)))
    for path, key, value in f.get_items("withoutHeaders"):
        headers.append(HeaderMatch(key.lower(), string_match_at(f, path, value), invert=True))
    query: list[tuple[str, StringMatch]] = []
    for path, key, value in f.get_items("queryParams"):
        sm = string_match_at(f, path, value)
        if sm is None:
            f.ctx.fail(path, "needs exact, prefix or regex")
        query.append((key, sm))
    match = HttpMatch(
        name=f.get_str("name"),
        uri=string_match(f, "uri"),
        ignore_uri_case=f.get_bool("ignoreUriCase"),
        method=string_match(f, "method"),
        authority=string_match(f, "authority"),
        scheme=string_match(f, "scheme"),
        headers=tuple(headers),
        query_params=tuple(query),
        port=f.get_port("port"),
        source_namespace=f.get_str("sourceNamespace"),
        source_labels=labels_of(f.get_labels("sourceLabels")),
        stat_prefix=f.get_str("statPrefix"),
        gateways=gateways,
    )
    unusable = f.unused()
    for key in unusable:
        f.ctx.warn(f"{format_path(f.at(key))} is not supported; this match is dropped")
    f.ignore(*unusable)
    if unusable:
        return None
    return match


def _destination(item: Fields, resolve: _Resolver) -> Destination:
    dest = _destination_fields(item.need_map("destination"), resolve)
    weight = item.get_int("weight", maximum=100)
    headers = parse_headers(item.get_map("headers"))
    item.finish()
    return Destination(dest.host, dest.subset, dest.port, weight or 0, headers)


def _destination_fields(f: Fields, resolve: _Resolver) -> Destination:
    host = f.get_str("host", required=True)
    if host.startswith("*"):
        f.fail("host", "must name one service, not a wildcard")
    check_host(f, f.at("host"), host)
    subset = f.get_str("subset")
    port_f = f.get_map("port")
    port = None
    if port_f is not None:
        port = port_f.need_port("number")
        port_f.finish()
    f.finish()
    return Destination(resolve(host), subset, port)


def _check_weights(f: Fields, destinations: tuple[Destination, ...]) -> None:
    if len(destinations) > 1:
        total = sum(d.weight for d in destinations)
        if total == 0:
            f.fail("route", "weights are required when there is more than one destination")
        if total != 100:
            f.ctx.warn(
                f"{format_path(f.at('route'))}: weights add up to {total}, not 100; "
                "used as relative weights"
            )


# --- TCP -------------------------------------------------------------------------------------


def _tcp_route(f: Fields, resolve: _Resolver) -> TcpRoute:
    ports, gateways = _l4_matches(f, f.get_maps("match"), resolve.namespace, "tcp", ())
    destinations = tuple(_destination(item, resolve) for item in f.get_maps("route", required=True))
    _check_weights(f, destinations)
    f.finish()
    return TcpRoute(ports, destinations, gateways)


def _l4_matches(
    f: Fields, items: list[Fields], namespace: str, what: str, extra: tuple[str, ...]
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Ports and gateways of tcp/tls matches. The model keeps one gateway list per route, so
    matches must agree on it: when only some name gateways, the others would widen the route."""
    ports: list[int] = []
    per_match: list[tuple[str, ...]] = []
    for item in items:
        port = item.get_port("port")
        per_match.append(_gateways(item, "gateways", namespace))
        item.ignore(*extra)
        for key in item.unused():
            only = ", ".join(("port", "gateways", *extra))
            item.fail(key, f"is not supported in {what} matches (only {only})")
        if port is not None:
            ports.append(port)
    gateways = per_match[0] if per_match else ()
    if any(g != gateways for g in per_match):
        f.fail("match", "every match of one route must name the same gateways (or none)")
    return tuple(ports), gateways


# --- TLS (passthrough by SNI, on gateways and sidecars) -----------------------------------


def _tls_route(f: Fields, resolve: _Resolver, hosts: tuple[str, ...]) -> TlsRoute:
    items = f.get_maps("match", required=True)
    sni: list[str] = []
    for item in items:
        for path, host in item.get_strs("sniHosts", required=True):
            check_host(item, path, host)
            resolved = resolve(host)
            if not any(host_matches(h, resolved) for h in hosts):
                item.ctx.fail(path, f"sniHost {host!r} is not one of the VirtualService's hosts")
            if resolved not in sni:
                sni.append(resolved)
    ports, gateways = _l4_matches(f, items, resolve.namespace, "tls", ("sniHosts",))
    destinations = tuple(_destination(item, resolve) for item in f.get_maps("route", required=True))
    _check_weights(f, destinations)
    f.finish()
    return TlsRoute(tuple(sni), ports, destinations, gateways)
