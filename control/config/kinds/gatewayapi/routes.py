"""Gateway API routes -> ApiRoute: `HTTPRoute`, `GRPCRoute`, `TLSRoute`, `TCPRoute`.

Matches and filters become model terms here (HttpMatch, HeaderOps, Redirect, Rewrite); what
needs the whole config (parents, backends, hostnames against listeners) is left to the
translator. A PathPrefix match stays a PREFIX here and is given the Gateway API's
path-element meaning by the translator (`/foo` matches `/foo` and `/foo/bar`, not `/foobar`).
A filter we cannot honour drops its rule (reported), so a route never does half of a rule.
"""

from __future__ import annotations

import dataclasses
import re

from control.config.fields import Context, Fields
from control.config.kinds.gatewayapi.refs import (
    backend_ref,
    created,
    gateway_spec,
    generation,
    header_filter,
    hostnames,
    parent_refs,
)
from control.config.manifest import format_path
from control.config.objects import ConfigObject
from control.model.gatewayapi import ApiRoute, Mirror, RouteKind, RouteRule
from control.model.traffic import (
    HeaderMatch,
    HttpMatch,
    MatchKind,
    Redirect,
    Rewrite,
    StringMatch,
)

_PATH_TYPES = ("Exact", "PathPrefix", "RegularExpression")
_VALUE_TYPES = ("Exact", "RegularExpression")
_REDIRECT_CODES = (301, 302, 303, 307, 308)
_METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH")


class _Unsupported(Exception):
    """A rule uses something we cannot do; the rule is dropped (already reported)."""


def convert_http(ctx: Context, domain: str) -> ConfigObject:
    return _convert(ctx, RouteKind.HTTP)


def convert_grpc(ctx: Context, domain: str) -> ConfigObject:
    return _convert(ctx, RouteKind.GRPC)


def convert_tls(ctx: Context, domain: str) -> ConfigObject:
    return _convert(ctx, RouteKind.TLS)


def convert_tcp(ctx: Context, domain: str) -> ConfigObject:
    return _convert(ctx, RouteKind.TCP)


def _convert(ctx: Context, kind: RouteKind) -> ConfigObject:
    spec = gateway_spec(ctx)
    parents = parent_refs(spec)
    names = hostnames(spec) if kind is not RouteKind.TCP else ()
    rules: list[RouteRule] = []
    for f in spec.get_maps("rules", required=kind in (RouteKind.TLS, RouteKind.TCP)):
        try:
            rules.append(_rule(f, kind))
        except _Unsupported:
            continue
    if kind in (RouteKind.HTTP, RouteKind.GRPC) and not spec.has("rules"):
        rules.append(RouteRule(matches=(_default_match(kind),)))
    spec.finish()
    route = ApiRoute(
        kind=kind,
        namespace=ctx.obj.namespace,
        name=ctx.obj.name,
        source=ctx.source,
        parents=parents,
        hostnames=names,
        rules=tuple(rules),
        generation=generation(ctx),
        created=created(ctx),
    )
    return ConfigObject(ctx.source, ctx.obj.data, gateway_api=(route,))


def _default_match(kind: RouteKind) -> HttpMatch:
    # HTTPRoute: a rule without matches matches every path (PathPrefix /); GRPCRoute: every
    # method, which is every path as well.
    return HttpMatch(uri=StringMatch(MatchKind.PREFIX, "/"))


def _rule(f: Fields, kind: RouteKind) -> RouteRule:
    f.ignore("name")
    backends = tuple(backend_ref(b) for b in f.get_maps("backendRefs"))
    if kind in (RouteKind.TLS, RouteKind.TCP):
        if not backends:
            f.fail("backendRefs", "is required")
        f.finish()
        return RouteRule(backends=backends)
    match_of = _http_match if kind is RouteKind.HTTP else _grpc_match
    matches = tuple(match_of(m) for m in f.get_maps("matches")) or (_default_match(kind),)
    rule = RouteRule(matches=matches, backends=backends)
    unsupported = False
    for item in f.get_maps("filters"):
        try:
            rule = _filter(item, rule, kind)
        except _Unsupported:
            unsupported = True
        item.finish()
    timeouts = f.get_map("timeouts")
    if timeouts is not None:
        rule = dataclasses.replace(rule, timeout=timeouts.get_duration("request"))
        if timeouts.has("backendRequest"):
            f.ctx.warn_unsupported(timeouts.at("backendRequest"))
            timeouts.ignore("backendRequest")
        timeouts.finish()
    for key in ("sessionPersistence", "retry"):
        if f.has(key):
            f.ctx.warn(f"{format_path(f.at(key))} is not supported; this rule is dropped")
            f.ignore(key)
            unsupported = True
    f.finish()
    if unsupported:
        raise _Unsupported
    if rule.redirect is not None and backends:
        f.fail("filters", "RequestRedirect cannot be combined with backendRefs")
    return rule


# --- matches ---------------------------------------------------------------------------------


def _regex(f: Fields, key: str, value: str) -> None:
    try:
        re.compile(value)
    except re.error as e:
        f.fail(key, f"invalid regular expression: {e}")


def _value_match(f: Fields) -> tuple[str, StringMatch]:
    """A header or query parameter match: `{type, name, value}`."""
    kind = f.get_enum("type", _VALUE_TYPES, default="Exact")
    name = f.get_str("name", required=True)
    value = f.get_str("value", required=True)
    if kind == "RegularExpression":
        _regex(f, "value", value)
        return name, StringMatch(MatchKind.REGEX, value)
    return name, StringMatch(MatchKind.EXACT, value)


def _headers(f: Fields) -> tuple[HeaderMatch, ...]:
    out: list[HeaderMatch] = []
    for h in f.get_maps("headers"):
        name, match = _value_match(h)
        h.finish()
        out.append(HeaderMatch(name.lower(), match))
    return tuple(out)


def _http_match(f: Fields) -> HttpMatch:
    uri = StringMatch(MatchKind.PREFIX, "/")
    path = f.get_map("path")
    if path is not None:
        kind = path.get_enum("type", _PATH_TYPES, default="PathPrefix")
        value = path.get_str("value", default="/")
        if kind == "RegularExpression":
            _regex(path, "value", value)
            uri = StringMatch(MatchKind.REGEX, value)
        else:
            if not value.startswith("/"):
                path.fail("value", "must start with /")
            uri = StringMatch(MatchKind.EXACT if kind == "Exact" else MatchKind.PREFIX, value)
        path.finish()
    query: list[tuple[str, StringMatch]] = []
    for q in f.get_maps("queryParams"):
        query.append(_value_match(q))
        q.finish()
    method = f.get_str("method")
    if method and method not in _METHODS:
        f.fail("method", f"must be one of {', '.join(_METHODS)}")
    match = HttpMatch(
        uri=uri,
        headers=_headers(f),
        query_params=tuple(query),
        method=StringMatch(MatchKind.EXACT, method) if method else None,
    )
    f.finish()
    return match


_GRPC_NAME = r"[^/]+"


def _grpc_match(f: Fields) -> HttpMatch:
    """A gRPC method is the HTTP/2 path `/<service>/<method>`."""
    uri = StringMatch(MatchKind.PREFIX, "/")
    method_f = f.get_map("method")
    if method_f is not None:
        kind = method_f.get_enum("type", _VALUE_TYPES, default="Exact")
        service = method_f.get_str("service")
        method = method_f.get_str("method")
        if not service and not method:
            method_f.fail(None, "needs service or method")
        if kind == "Exact":
            for key, value in (("service", service), ("method", method)):
                if "/" in value:
                    method_f.fail(key, "must not contain /")
            if service and method:
                uri = StringMatch(MatchKind.EXACT, f"/{service}/{method}")
            else:
                service_re = re.escape(service) if service else _GRPC_NAME
                method_re = re.escape(method) if method else _GRPC_NAME
                uri = StringMatch(MatchKind.REGEX, f"/{service_re}/{method_re}")
        else:
            for key, value in (("service", service), ("method", method)):
                if value:
                    _regex(method_f, key, value)
            uri = StringMatch(MatchKind.REGEX, f"/{service or _GRPC_NAME}/{method or _GRPC_NAME}")
        method_f.finish()
    match = HttpMatch(uri=uri, headers=_headers(f))
    f.finish()
    return match


# --- filters ---------------------------------------------------------------------------------


def _filter(item: Fields, rule: RouteRule, kind: RouteKind) -> RouteRule:
    ftype = item.get_str("type", required=True)
    if ftype in ("RequestHeaderModifier", "ResponseHeaderModifier"):
        return dataclasses.replace(rule, headers=header_filter(item, ftype, rule.headers))
    if ftype == "RequestMirror":
        return dataclasses.replace(rule, mirrors=(*rule.mirrors, _mirror(item)))
    if kind is RouteKind.HTTP and ftype == "RequestRedirect":
        return dataclasses.replace(rule, redirect=_redirect(item))
    if kind is RouteKind.HTTP and ftype == "URLRewrite":
        rewrite, prefix = _rewrite(item)
        return dataclasses.replace(rule, rewrite=rewrite, replace_prefix=prefix)
    item.ctx.warn(
        f"{format_path(item.at('type'))}: filter {ftype} is not supported; this rule is dropped"
    )
    for key in item.unused():
        item.ignore(key)
    raise _Unsupported


def _mirror(item: Fields) -> Mirror:
    f = item.need_map("requestMirror")
    backend = backend_ref(f.need_map("backendRef"), with_filters=False)
    percent = 100.0
    value = f.get_int("percent", maximum=100)
    if value is not None:
        percent = float(value)
    fraction = f.get_map("fraction")
    if fraction is not None:
        numerator = fraction.get_int("numerator", required=True) or 0
        denominator = fraction.get_int("denominator", minimum=1) or 100
        if numerator > denominator:
            fraction.fail("numerator", "must not be larger than the denominator")
        percent = 100.0 * numerator / denominator
        fraction.finish()
    f.finish()
    return Mirror(backend, percent)


def _path_modifier(f: Fields) -> tuple[str, str]:
    """`path: {type: ReplaceFullPath | ReplacePrefixMatch, ...}` -> (type, value)."""
    kind = f.get_enum("type", ("ReplaceFullPath", "ReplacePrefixMatch"), default="")
    key = "replaceFullPath" if kind == "ReplaceFullPath" else "replacePrefixMatch"
    value = f.get_str(key, default="/")
    if not value.startswith("/"):
        f.fail(key, "must start with /")
    f.finish()
    return kind, value


def _redirect(item: Fields) -> Redirect:
    f = item.need_map("requestRedirect")
    code = f.get_int("statusCode") or 302
    if code not in _REDIRECT_CODES:
        f.fail("statusCode", f"must be one of {', '.join(map(str, _REDIRECT_CODES))}")
    scheme = f.get_enum("scheme", ("http", "https", ""), default="")
    uri = ""
    path = f.get_map("path")
    if path is not None:
        kind, uri = _path_modifier(path)
        if kind == "ReplacePrefixMatch":
            item.ctx.warn(
                f"{format_path(path.at('type'))}: ReplacePrefixMatch in a RequestRedirect is "
                "not supported; this rule is dropped"
            )
            f.ignore(*f.unused())
            raise _Unsupported
    redirect = Redirect(
        uri=uri,
        authority=f.get_str("hostname"),
        port=f.get_port("port"),
        scheme=scheme,
        code=code,
    )
    f.finish()
    return redirect


def _rewrite(item: Fields) -> tuple[Rewrite, str | None]:
    f = item.need_map("urlRewrite")
    hostname = f.get_str("hostname")
    regex: tuple[str, str] | None = None
    prefix: str | None = None
    path = f.get_map("path")
    if path is not None:
        kind, value = _path_modifier(path)
        if kind == "ReplaceFullPath":
            regex = ("^/.*$", value)
        else:
            prefix = value
    f.finish()
    return Rewrite(authority=hostname, uri_regex=regex), prefix
