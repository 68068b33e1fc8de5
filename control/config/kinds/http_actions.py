"""What an Istio VirtualService HTTP route does besides picking destinations, parsed into the
model: redirect, direct response, CORS, rewrite, retries, fault injection and header
operations, and the StringMatch that matches and CORS origins share. Kept apart from
virtualservice.py, which reads routes, matches and destinations and binds them.
"""

from __future__ import annotations

import base64
import binascii
import re

from control.config.fields import Fields
from control.model.traffic import (
    MAX_DIRECT_RESPONSE_BODY,
    CorsPolicy,
    DirectResponse,
    Fault,
    HeaderOps,
    MatchKind,
    Redirect,
    Retries,
    Rewrite,
    StringMatch,
)

_REDIRECT_CODES = (301, 302, 303, 307, 308)


def string_match(f: Fields, key: str) -> StringMatch | None:
    if f.raw(key) is None:
        return None
    return string_match_at(f, f.at(key), f.raw(key))


def string_match_at(f: Fields, path: tuple[str | int, ...], value: object) -> StringMatch | None:
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


def parse_redirect(f: Fields | None) -> Redirect | None:
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


def parse_direct_response(f: Fields | None) -> DirectResponse | None:
    if f is None:
        return None
    status = f.get_int("status", required=True, minimum=200, maximum=599)
    assert status is not None
    body: str | bytes | None = None
    b = f.get_map("body")
    if b is not None:
        if b.has("string") and b.has("bytes"):
            b.fail(None, "takes one of string or bytes, not both")
        size = 0
        if b.has("string"):
            body = b.get_str("string")
            size = len(body.encode())
        elif b.has("bytes"):
            body = _base64(b, "bytes")
            size = len(body)
        if size > MAX_DIRECT_RESPONSE_BODY:
            b.fail(
                None,
                f"is {size} bytes; the limit is {MAX_DIRECT_RESPONSE_BODY} (1 MiB, as Istio's)",
            )
        b.finish()
    f.finish()
    return DirectResponse(status, body)


def parse_cors(f: Fields | None) -> CorsPolicy | None:
    if f is None:
        return None
    origins = [
        sm
        for path, value in f.get_list("allowOrigins")
        if (sm := string_match_at(f, path, value)) is not None
    ]
    legacy = f.get_strs("allowOrigin")
    if legacy:
        if origins:
            f.fail("allowOrigin", "cannot be combined with allowOrigins (its replacement)")
        origins = [StringMatch(MatchKind.EXACT, origin) for _, origin in legacy]
    max_age = f.get_duration("maxAge")
    allow_credentials = f.raw("allowCredentials")
    if allow_credentials is not None and not isinstance(allow_credentials, bool):
        f.fail("allowCredentials", "must be true or false")
    preflights = f.get_enum(
        "unmatchedPreflights", ("UNSPECIFIED", "FORWARD", "IGNORE"), default="FORWARD"
    )
    policy = CorsPolicy(
        allow_origins=tuple(origins),
        allow_methods=tuple(v for _, v in f.get_strs("allowMethods")),
        allow_headers=tuple(v for _, v in f.get_strs("allowHeaders")),
        expose_headers=tuple(v for _, v in f.get_strs("exposeHeaders")),
        max_age=None if max_age is None else int(max_age),
        allow_credentials=allow_credentials,
        forward_unmatched_preflights=preflights != "IGNORE",
    )
    f.finish()
    return policy


def _base64(f: Fields, key: str) -> bytes:
    """A protobuf `bytes` field in YAML: base64, standard or URL-safe, padded or not, as
    protojson reads it."""
    text = f.get_str(key)
    try:
        raw = text.encode("ascii").replace(b"-", b"+").replace(b"_", b"/")
        return base64.b64decode(raw + b"=" * (-len(raw) % 4), validate=True)
    except (UnicodeEncodeError, binascii.Error):
        f.fail(key, "is not base64")


def parse_rewrite(f: Fields | None) -> Rewrite | None:
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


def parse_retries(f: Fields | None) -> Retries | None:
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


def parse_fault(f: Fields | None) -> Fault | None:
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


def parse_headers(f: Fields | None) -> HeaderOps:
    if f is None:
        return HeaderOps()
    request = _header_part(f.get_map("request"))
    response = _header_part(f.get_map("response"))
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


def _header_part(f: Fields | None) -> HeaderOpsPart:
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
