"""Istio `VirtualService` -> model VirtualService (HTTP and TCP routes for sidecars).

Only the `mesh` gateway exists here. A VirtualService bound to other gateways only is reported
and ignored; `mesh` next to other gateways keeps the `mesh` part. A match condition we cannot
honour (sourceLabels, ...) is reported and its match is dropped, so the route matches less,
never more.
"""

from __future__ import annotations

import re

from control.config import formats
from control.config.fields import Context, Fields
from control.config.kinds.common import (
    ISTIO_NETWORKING_VERSIONS,
    check_host,
    export_to,
    resolve_host,
    spec_of,
)
from control.config.manifest import format_path
from control.config.objects import ConfigObject
from control.model.traffic import (
    Destination,
    Fault,
    HeaderMatch,
    HeaderOps,
    HttpMatch,
    HttpRoute,
    MatchKind,
    Redirect,
    Retries,
    Rewrite,
    StringMatch,
    TcpRoute,
    VirtualService,
)

API_VERSIONS = ISTIO_NETWORKING_VERSIONS

MESH_GATEWAY = "mesh"
_REDIRECT_CODES = (301, 302, 303, 307, 308)


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
    for path, host in spec.get_strs("hosts", required=True):
        check_host(spec, path, host)
        resolved = resolve(host)
        if resolved not in hosts:
            hosts.append(resolved)
    for_mesh = _gateways(spec, "gateways")
    http = tuple(
        r for item in spec.get_maps("http") if (r := _http_route(item, resolve)) is not None
    )
    tcp = tuple(_tcp_route(item, resolve) for item in spec.get_maps("tcp"))
    if spec.has("tls"):
        ctx.warn_unsupported(spec.at("tls"), "(TLS routes by SNI)")
        spec.ignore("tls")
    exports = export_to(spec)
    spec.finish()
    if not any(spec.has(k) for k in ("http", "tcp", "tls")):
        spec.fail(None, "needs http or tcp routes")
    if not for_mesh:
        ctx.warn("applies to gateways only (spec.gateways has no 'mesh'); ignored for sidecars")
        return ConfigObject(ctx.source, obj.data)
    vs = VirtualService(
        namespace=obj.namespace,
        name=obj.name,
        source=ctx.source,
        hosts=tuple(hosts),
        http=http,
        tcp=tcp,
        export_to=exports,
    )
    return ConfigObject(ctx.source, obj.data, virtual_services=(vs,))


def _gateways(f: Fields, key: str) -> bool:
    """True when the object (or match) applies to sidecars (`mesh`, or no gateways at all)."""
    gateways = [g for _, g in f.get_strs(key)]
    if not gateways:
        return True
    others = [g for g in gateways if g != MESH_GATEWAY]
    if others:
        f.ctx.warn(
            f"{format_path(f.at(key))}: gateways {', '.join(others)} are not supported; "
            "only 'mesh' (sidecars) is served"
        )
    return MESH_GATEWAY in gateways


# --- HTTP ------------------------------------------------------------------------------------


def _http_route(f: Fields, resolve: _Resolver) -> HttpRoute | None:
    name = f.get_str("name")
    matches: list[HttpMatch] = []
    items = f.get_maps("match")
    for item in items:
        match = _http_match(item)
        if match is not None:
            matches.append(match)
    if items and not matches:
        f.ctx.warn(f"{format_path(f.path)}: no match condition is usable; route ignored")
        return None
    destinations = tuple(_destination(item, resolve) for item in f.get_maps("route"))
    _check_weights(f, destinations)
    redirect = _redirect(f.get_map("redirect"))
    if f.has("directResponse"):
        f.fail("directResponse", "is not supported")
    if redirect is not None and destinations:
        f.fail("redirect", "cannot be combined with route")
    if redirect is None and not destinations:
        f.fail("route", "is required (or a redirect)")
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
        rewrite=_rewrite(f.get_map("rewrite")),
        timeout=f.get_duration("timeout"),
        retries=_retries(f.get_map("retries")),
        fault=_fault(f.get_map("fault")),
        mirror=mirror,
        mirror_percent=mirror_percent,
        headers=_headers(f.get_map("headers")),
    )
    f.finish()
    return route


def _http_match(f: Fields) -> HttpMatch | None:
    for_mesh = _gateways(f, "gateways")
    headers: list[HeaderMatch] = []
    for path, key, value in f.get_items("headers"):
        headers.append(HeaderMatch(key.lower(), _string_match_at(f, path, value)))
    for path, key, value in f.get_items("withoutHeaders"):
        headers.append(HeaderMatch(key.lower(), _string_match_at(f, path, value), invert=True))
    query: list[tuple[str, StringMatch]] = []
    for path, key, value in f.get_items("queryParams"):
        sm = _string_match_at(f, path, value)
        if sm is None:
            f.ctx.fail(path, "needs exact, prefix or regex")
        query.append((key, sm))
    match = HttpMatch(
        name=f.get_str("name"),
        uri=_string_match(f, "uri"),
        ignore_uri_case=f.get_bool("ignoreUriCase"),
        method=_string_match(f, "method"),
        authority=_string_match(f, "authority"),
        headers=tuple(headers),
        query_params=tuple(query),
        port=f.get_port("port"),
        source_namespace=f.get_str("sourceNamespace"),
    )
    unusable = f.unused()
    for key in unusable:
        f.ctx.warn(f"{format_path(f.at(key))} is not supported; this match is dropped")
    f.ignore(*unusable)
    if unusable or not for_mesh:
        return None
    return match


def _string_match(f: Fields, key: str) -> StringMatch | None:
    if f.raw(key) is None:
        return None
    return _string_match_at(f, f.at(key), f.raw(key))


def _string_match_at(f: Fields, path: tuple[str | int, ...], value: object) -> StringMatch | None:
    """An Istio StringMatch (`{exact: ..}`, `{prefix: ..}`, `{regex: ..}`); `{}` = presence."""
    if not isinstance(value, dict):
        f.ctx.fail(path, "must be a mapping with exact, prefix or regex")
    if not value:
        return None
    if len(value) != 1 or next(iter(value)) not in ("exact", "prefix", "regex"):
        f.ctx.fail(path, "must have exactly one of exact, prefix, regex")
    kind, text = next(iter(value.items()))
    if not isinstance(text, str):
        f.ctx.fail((*path, kind), "must be a string")
    if kind == "regex":
        try:
            re.compile(text)
        except re.error as e:
            f.ctx.fail((*path, kind), f"invalid regular expression: {e}")
    return StringMatch(MatchKind(kind), text)


def _destination(item: Fields, resolve: _Resolver) -> Destination:
    dest = _destination_fields(item.need_map("destination"), resolve)
    weight = item.get_int("weight", maximum=100)
    headers = _headers(item.get_map("headers"))
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


def _redirect(f: Fields | None) -> Redirect | None:
    if f is None:
        return None
    code = f.get_int("redirectCode") or 301
    if code not in _REDIRECT_CODES:
        f.fail("redirectCode", f"must be one of {', '.join(map(str, _REDIRECT_CODES))}")
    result = Redirect(
        uri=f.get_str("uri"),
        authority=f.get_str("authority"),
        port=f.get_port("port"),
        scheme=f.get_str("scheme"),
        code=code,
    )
    f.finish()
    return result


def _rewrite(f: Fields | None) -> Rewrite | None:
    if f is None:
        return None
    regex = None
    rr = f.get_map("uriRegexRewrite")
    if rr is not None:
        pattern = rr.get_str("match", required=True)
        try:
            re.compile(pattern)
        except re.error as e:
            rr.fail("match", f"invalid regular expression: {e}")
        regex = (pattern, rr.get_str("rewrite"))
        rr.finish()
    result = Rewrite(uri=f.get_str("uri"), authority=f.get_str("authority"), uri_regex=regex)
    if result.uri and regex:
        f.fail("uriRegexRewrite", "cannot be combined with uri")
    f.finish()
    return result


def _retries(f: Fields | None) -> Retries | None:
    if f is None:
        return None
    result = Retries(
        attempts=f.get_int("attempts", maximum=1000) or 0,
        per_try_timeout=f.get_duration("perTryTimeout", positive=True),
        retry_on=f.get_str("retryOn"),
    )
    f.ignore("retryRemoteLocalities")
    f.finish()
    return result


def _fault(f: Fields | None) -> Fault | None:
    if f is None:
        return None
    fault = Fault()
    delay = f.get_map("delay")
    if delay is not None:
        seconds = delay.get_duration("fixedDelay", positive=True)
        if seconds is None:
            delay.fail("fixedDelay", "is required")
        percent = delay.get_percent("percentage")
        if percent is None:
            legacy = delay.get_int("percent", maximum=100)
            percent = 100.0 if legacy is None else float(legacy)
        delay.finish()
        fault = Fault(delay=seconds, delay_percent=percent)
    abort = f.get_map("abort")
    if abort is not None:
        status = abort.get_int("httpStatus", minimum=200, maximum=599)
        if status is None:
            abort.fail("httpStatus", "is required (grpcStatus is not supported)")
        percent = abort.get_percent("percentage")
        fault = Fault(
            delay=fault.delay,
            delay_percent=fault.delay_percent,
            abort_status=status,
            abort_percent=100.0 if percent is None else percent,
        )
        abort.finish()
    f.finish()
    return fault


def _headers(f: Fields | None) -> HeaderOps:
    if f is None:
        return HeaderOps()
    request = _header_ops(f.get_map("request"))
    response = _header_ops(f.get_map("response"))
    f.finish()
    return HeaderOps(
        request_set=request[0],
        request_add=request[1],
        request_remove=request[2],
        response_set=response[0],
        response_add=response[1],
        response_remove=response[2],
    )


HeaderOpsPart = tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...], tuple[str, ...]]


def _header_ops(f: Fields | None) -> HeaderOpsPart:
    if f is None:
        return (), (), ()

    def pairs(key: str) -> tuple[tuple[str, str], ...]:
        out: list[tuple[str, str]] = []
        for path, name, value in f.get_items(key):
            if not isinstance(value, str):
                f.ctx.fail(path, "must be a string")
            out.append((name.lower(), value))
        return tuple(out)

    result = (pairs("set"), pairs("add"), tuple(v.lower() for _, v in f.get_strs("remove")))
    f.finish()
    return result


# --- TCP -------------------------------------------------------------------------------------


def _tcp_route(f: Fields, resolve: _Resolver) -> TcpRoute:
    ports: list[int] = []
    for item in f.get_maps("match"):
        port = item.get_port("port")
        for key in item.unused():
            item.fail(key, "is not supported in tcp matches (only port)")
        if port is not None:
            ports.append(port)
    destinations = tuple(_destination(item, resolve) for item in f.get_maps("route", required=True))
    _check_weights(f, destinations)
    f.finish()
    return TcpRoute(tuple(ports), destinations)
