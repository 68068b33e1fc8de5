"""Istio `Telemetry` (telemetry.istio.io/v1, v1alpha1) -> model Telemetry.

`accessLogging[].filter.expression` is CEL in Istio; Envoy's CEL filter is not what pilotfish
generates, so the common forms are compiled to Envoy's status-code filters: comparisons of
`response.code` with an integer (`==`, `!=`, `>=`, `>`, `<=`, `<`), several joined all by `&&`
or all by `||`. Any other expression is reported and its entry ignored (never half-applied:
logging everything, or nothing, would not be what the user wrote).
"""

from __future__ import annotations

import re

from control.config import formats
from control.config.fields import Context, Fields
from control.config.kinds.common import spec_of
from control.config.kinds.security import match_labels
from control.config.manifest import format_path
from control.config.objects import ConfigObject
from control.model.telemetry import (
    AccessLogging,
    CodeFilter,
    CustomTag,
    CustomTagKind,
    MetricOverride,
    Metrics,
    TagOverride,
    Telemetry,
    Tracing,
    WorkloadMode,
)
from protos.telemetry import STANDARD_METRICS

API_VERSIONS = ("telemetry.istio.io/v1", "telemetry.istio.io/v1alpha1")

_MODES = tuple(m.value for m in WorkloadMode)
_TERM = re.compile(r"\s*\(?\s*response\.code\s*(==|!=|>=|<=|>|<)\s*(\d{1,3})\s*\)?\s*")
# Istio's metric names; the gRPC message counts are accepted (Istio has them) but never
# produced here, so overriding them changes nothing.
_METRICS = ("ALL_METRICS", *STANDARD_METRICS, "GRPC_REQUEST_MESSAGES", "GRPC_RESPONSE_MESSAGES")


def parse_code_filter(expression: str) -> CodeFilter | None:
    """The expression as a status-code filter, or None when it is not one of the forms
    Envoy can run without CEL (see the module doc)."""
    text = expression.strip()
    if "&&" in text and "||" in text:
        return None
    all_of = "||" not in text
    parts = text.split("&&" if all_of else "||")
    terms: list[tuple[str, int]] = []
    for part in parts:
        m = _TERM.fullmatch(part)
        if m is None:
            return None
        terms.append((m.group(1), int(m.group(2))))
    return CodeFilter(tuple(terms), all_of, text)


def convert(ctx: Context, domain: str) -> ConfigObject:
    del domain
    obj = ctx.obj
    spec = spec_of(ctx, formats.dns1123_subdomain)
    selector = match_labels(spec)
    for key in ("targetRef", "targetRefs"):
        if spec.raw(key) is not None:
            ctx.warn(
                f"spec.{key} is not supported (no waypoints or gateway targeting here); "
                "this Telemetry is ignored"
            )
            spec.finish()
            return ConfigObject(ctx.source, obj.data)
    telemetry = Telemetry(
        namespace=obj.namespace,
        name=obj.name,
        source=ctx.source,
        selector=selector,
        access_logging=tuple(
            a for a in (_access_logging(f) for f in spec.get_maps("accessLogging")) if a
        ),
        tracing=tuple(_tracing(f) for f in spec.get_maps("tracing")),
        metrics=tuple(_metrics(f) for f in spec.get_maps("metrics")),
    )
    spec.finish()
    return ConfigObject(ctx.source, obj.data, telemetries=(telemetry,))


def _mode(f: Fields) -> WorkloadMode:
    match = f.get_map("match")
    if match is None:
        return WorkloadMode.CLIENT_AND_SERVER
    mode = WorkloadMode(match.get_enum("mode", _MODES, default="CLIENT_AND_SERVER"))
    match.finish()
    return mode


def _providers(f: Fields) -> tuple[str, ...]:
    out: list[str] = []
    for p in f.get_maps("providers"):
        out.append(p.get_str("name", required=True))
        p.finish()
    return tuple(out)


def _optional_bool(f: Fields, key: str) -> bool | None:
    return f.get_bool(key) if f.raw(key) is not None else None


def _access_logging(f: Fields) -> AccessLogging | None:
    mode = _mode(f)
    providers = _providers(f)
    disabled = _optional_bool(f, "disabled")
    code_filter = None
    flt = f.get_map("filter")
    if flt is not None:
        expression = flt.get_str("expression", required=True)
        flt.finish()
        code_filter = parse_code_filter(expression)
        if code_filter is None:
            f.ctx.warn(
                f"{format_path(flt.at('expression'))} {expression!r} is not supported (only "
                "comparisons of response.code with integers, joined by && or by ||); "
                "this accessLogging entry is ignored"
            )
            f.finish()
            return None
    f.finish()
    return AccessLogging(providers, disabled, code_filter, mode)


def _tracing(f: Fields) -> Tracing:
    mode = _mode(f)
    providers = _providers(f)
    sampling = None
    value = f.raw("randomSamplingPercentage")
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 100:
            f.fail("randomSamplingPercentage", "must be a number 0-100")
        sampling = float(value)
    tags: list[CustomTag] = []
    for path, tag, body in f.get_items("customTags"):
        if not isinstance(body, dict):
            f.ctx.fail(path, "must be a mapping with one of literal, header, environment")
        tags.append(_custom_tag(Fields(f.ctx, path, body), tag))
    tracing = Tracing(
        providers=providers,
        random_sampling_percentage=sampling,
        custom_tags=tuple(tags),
        disable_span_reporting=_optional_bool(f, "disableSpanReporting"),
        use_request_id_for_trace_sampling=_optional_bool(f, "useRequestIdForTraceSampling"),
        mode=mode,
    )
    f.finish()
    return tracing


def _custom_tag(f: Fields, tag: str) -> CustomTag:
    kinds = [k for k in CustomTagKind if f.raw(k.value) is not None]
    if len(kinds) != 1:
        f.fail(None, "must set exactly one of literal, header, environment")
    kind = kinds[0]
    body = f.need_map(kind.value)
    if kind is CustomTagKind.LITERAL:
        out = CustomTag(tag, kind, body.get_str("value", required=True))
    else:
        out = CustomTag(
            tag, kind, body.get_str("name", required=True), body.get_str("defaultValue")
        )
    body.finish()
    f.finish()
    return out


def _metrics(f: Fields) -> Metrics:
    providers = _providers(f)
    overrides: list[MetricOverride] = []
    for o in f.get_maps("overrides"):
        metric, mode = "ALL_METRICS", WorkloadMode.CLIENT_AND_SERVER
        match = o.get_map("match")
        if match is not None:
            custom = match.get_str("customMetric")
            if custom:
                o.ctx.warn(
                    f"{format_path(match.at('customMetric'))} {custom!r}: only Istio's "
                    "standard metrics are produced here; this override changes nothing"
                )
            metric = custom or match.get_enum("metric", _METRICS, default="ALL_METRICS")
            mode = WorkloadMode(match.get_enum("mode", _MODES, default="CLIENT_AND_SERVER"))
            match.finish()
        tags: list[TagOverride] = []
        for path, tag, body in o.get_items("tagOverrides"):
            if not isinstance(body, dict):
                o.ctx.fail(path, "must be a mapping like {operation: REMOVE}")
            t = Fields(o.ctx, path, body)
            operation = t.get_enum("operation", ("UPSERT", "REMOVE"), default="UPSERT")
            value = t.get_str("value")
            if operation == "UPSERT" and not value:
                t.fail("value", "is required for operation UPSERT")
            if operation == "UPSERT":
                # A CEL expression evaluated per request: the agent computes labels from
                # access log entries and has no CEL; only REMOVE is applied.
                o.ctx.warn(
                    f"{format_path(path)}: operation UPSERT is not supported (only REMOVE); "
                    "this tag override is ignored"
                )
            t.finish()
            tags.append(TagOverride(tag, operation, value))
        overrides.append(MetricOverride(metric, mode, _optional_bool(o, "disabled"), tuple(tags)))
        o.finish()
    interval = f.get_duration("reportingInterval", positive=True)
    f.finish()
    return Metrics(providers, tuple(overrides), interval)
