"""Istio MeshConfig YAML -> MeshSettings (control/model/meshconfig.py), with `file:line` errors.

The text is what `--mesh-config FILE` holds, or the `mesh` key of the ConfigMap `istio`: a
plain mapping with Istio's field names (no apiVersion/kind envelope). A bad value is a
ConfigError naming the field and its line; a field pilotfish does not use is a warning
(`<field> is not supported; ignored`), never silently dropped.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from control.config.errors import ConfigError
from control.config.fields import Context, Fields
from control.config.locality import locality_lb_setting
from control.config.manifest import RawObject, format_path
from control.config.yamlsource import Path, parse_yaml
from control.model.meshconfig import (
    BUILTIN_PROVIDERS,
    HTTP_ALS,
    LOCALITY_LB_DEFAULT,
    OTEL_ALS,
    TCP_ALS,
    AccessLogEncoding,
    DefaultProviders,
    ExtensionProvider,
    FileAccessLogProvider,
    GrpcAccessLogProvider,
    MeshSettings,
    OpenTelemetryProvider,
    PrometheusProvider,
    Provider,
    ProxyDefaults,
    ZipkinProvider,
)
from control.model.traffic import LocalityLbSetting
from control.model.types import Labels, labels_of

KIND = "MeshConfig"
_POLICIES = ("ALLOW_ANY", "REGISTRY_ONLY")
_ENCODINGS = tuple(e.value for e in AccessLogEncoding)
# Fields that only matter to parts of Istio pilotfish does not have; accepted quietly so an
# Istio mesh config loads without a page of warnings.
_QUIET = (
    "enablePrometheusMerge",
    "enableAutoMtls",
    "ingressClass",
    "ingressControllerMode",
    "ingressService",
    "ingressSelector",
    "defaultServiceExportTo",
    "defaultVirtualServiceExportTo",
    "defaultDestinationRuleExportTo",
    "protocolDetectionTimeout",
    "dnsRefreshRate",
    "connectTimeout",
    "tcpKeepalive",
    "inboundTrafficPolicy",
    "discoverySelectors",
    "caCertificates",
    "trustDomainAliases",
    "enableEnvoyAccessLogService",
)


class _MeshContext(Context):
    """Errors and warnings name the mesh config (`file:line: MeshConfig: field: reason`)."""

    def error(self, path: Path, reason: str) -> ConfigError:
        where = f"{format_path(path)}: " if path else ""
        return ConfigError(self.obj.file, self.obj.line_of(path), f"{KIND}: {where}{reason}")


def parse_mesh_config(text: str, file: str) -> MeshSettings:
    """The settings in `text` (the contents of `file`); an empty text is Istio's defaults.
    Raises ConfigError for bad YAML or a bad value."""
    docs = parse_yaml(text, file)
    if not docs:
        return MeshSettings(source=file)
    if len(docs) > 1:
        raise ConfigError(file, docs[1].line, f"{KIND}: one YAML document expected, got more")
    doc = docs[0]
    if not isinstance(doc.value, dict):
        raise ConfigError(file, doc.line, f"{KIND}: must be a mapping of MeshConfig fields")
    raw = RawObject(file, doc.line, "", KIND, "", file, doc.value, doc.lines)
    ctx = _MeshContext(raw)
    root = Fields(ctx, (), dict(doc.value))
    root.ignore(*_QUIET)
    settings = MeshSettings(
        access_log_file=root.get_str("accessLogFile"),
        access_log_encoding=AccessLogEncoding(
            root.get_enum("accessLogEncoding", _ENCODINGS, default="TEXT")
        ),
        access_log_format=root.get_str("accessLogFormat"),
        enable_tracing=root.get_bool("enableTracing", default=True),
        default_config=_proxy_defaults(root.get_map("defaultConfig")),
        extension_providers=_providers(root),
        default_providers=_default_providers(root.get_map("defaultProviders")),
        outbound_traffic_policy=_outbound(root.get_map("outboundTrafficPolicy")),
        trust_domain=root.get_str("trustDomain", default="cluster.local"),
        root_namespace=root.get_str("rootNamespace", default="istio-system"),
        locality_lb=_locality_lb(root.get_map("localityLbSetting")),
        source=file,
    )
    root.finish()
    return replace(settings, warnings=tuple(ctx.warnings))


def _locality_lb(f: Fields | None) -> LocalityLbSetting:
    if f is None:
        return LOCALITY_LB_DEFAULT
    return locality_lb_setting(f)


def _outbound(f: Fields | None) -> str:
    if f is None:
        return "ALLOW_ANY"
    mode = f.get_enum("mode", _POLICIES, default="ALLOW_ANY")
    f.ignore("egressProxy")
    f.finish()
    return mode


def _proxy_defaults(f: Fields | None) -> ProxyDefaults:
    if f is None:
        return ProxyDefaults()
    drain = f.get_duration("drainDuration")
    hold = f.get_bool("holdApplicationUntilProxyStarts")
    metadata = _string_map(f, "proxyMetadata")
    sampling = 1.0
    tracing = f.get_map("tracing")
    if tracing is not None:
        value = tracing.raw("sampling")
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                tracing.fail("sampling", "must be a number 0-100 (percent)")
            if not 0 <= value <= 100:
                tracing.fail("sampling", "must be a number 0-100 (percent)")
            sampling = float(value)
        tracing.finish()
    # ProxyConfig has dozens of fields the agent decides itself (ports, paths, concurrency);
    # they are accepted and reported, never half-applied.
    f.finish()
    return ProxyDefaults(
        drain_duration=drain,
        hold_application_until_proxy_starts=hold,
        proxy_metadata=labels_of(metadata),
        tracing_sampling=sampling,
    )


def _string_map(f: Fields, key: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for path, k, v in f.get_items(key):
        if not isinstance(v, str):
            f.ctx.fail(path, "must be a string (quote numbers and booleans)")
        out[k] = v
    return out


def _default_providers(f: Fields | None) -> DefaultProviders:
    if f is None:
        return DefaultProviders()
    out = DefaultProviders(
        metrics=tuple(v for _, v in f.get_strs("metrics"))
        if f.raw("metrics") is not None
        else ("prometheus",),
        tracing=tuple(v for _, v in f.get_strs("tracing")),
        access_logging=tuple(v for _, v in f.get_strs("accessLogging")),
    )
    f.finish()
    return out


_PROVIDER_KINDS = (
    "envoyFileAccessLog",
    HTTP_ALS,
    TCP_ALS,
    OTEL_ALS,
    "zipkin",
    "opentelemetry",
    "prometheus",
)
# Provider kinds Istio has that pilotfish does not parse: reported, the provider skipped.
_OTHER_KINDS = (
    "envoyExtAuthzHttp",
    "envoyExtAuthzGrpc",
    "datadog",
    "lightstep",
    "skywalking",
    "stackdriver",
    "sds",
)


def _providers(root: Fields) -> tuple[ExtensionProvider, ...]:
    """The user's providers, then Istio's built-ins (`envoy`, `prometheus`) unless the user
    defined a provider of that name."""
    out: list[ExtensionProvider] = []
    seen: set[str] = set()
    for f in root.get_maps("extensionProviders"):
        name = f.get_str("name", required=True)
        if name in seen:
            f.fail("name", f"duplicate extension provider {name!r}")
        seen.add(name)
        present = [k for k in (*_PROVIDER_KINDS, *_OTHER_KINDS) if f.raw(k) is not None]
        if len(present) != 1:
            f.fail(None, f"provider {name!r} must set exactly one of {', '.join(_PROVIDER_KINDS)}")
        kind = present[0]
        if kind in _OTHER_KINDS:
            f.ctx.warn(f"{format_path(f.at(kind))} (provider {name!r}) is not supported; ignored")
            continue
        body = f.get_map(kind)
        provider = _provider(kind, body if body is not None else Fields(f.ctx, f.at(kind), {}))
        out.append(ExtensionProvider(name, provider))
        f.finish()
    out.extend(p for p in BUILTIN_PROVIDERS if p.name not in seen)
    return tuple(out)


def _provider(kind: str, f: Fields) -> Provider:
    provider: Provider
    if kind == "envoyFileAccessLog":
        text, labels = _log_format(f, exclusive=True)
        provider = FileAccessLogProvider(
            path=f.get_str("path", default="/dev/stdout"), text=text, labels=labels
        )
    elif kind in (HTTP_ALS, TCP_ALS, OTEL_ALS):
        provider = _grpc_log_provider(kind, f)
    elif kind == "zipkin":
        provider = ZipkinProvider(
            service=f.get_str("service", required=True),
            port=f.need_port("port"),
            max_tag_length=f.get_int("maxTagLength") or 0,
            enable_64bit_trace_id=f.get_bool("enable64bitTraceId"),
            path=f.get_str("path", default="/api/v2/spans"),
        )
        f.ignore("headers", "traceContextOption")
    elif kind == "opentelemetry":
        http_path = ""
        timeout = 0.0
        http = f.get_map("http")
        if http is not None:
            http_path = http.get_str("path", default="/v1/traces")
            http.ignore("timeout", "headers")
            http.finish()
            f.ctx.warn(
                f"{format_path(http.path)}: the OTLP/HTTP exporter is not supported; "
                "this provider exports over gRPC"
            )
        grpc = f.get_map("grpc")
        if grpc is not None:
            timeout = grpc.get_duration("timeout") or 0.0
            grpc.ignore("initialMetadata")
            grpc.finish()
        provider = OpenTelemetryProvider(
            service=f.get_str("service", required=True),
            port=f.need_port("port"),
            max_tag_length=f.get_int("maxTagLength") or 0,
            http_path=http_path,
            timeout=timeout,
        )
        f.ignore("resourceDetectors", "dynatraceSampler", "sampling")
    else:
        provider = PrometheusProvider()
    f.finish()
    return provider


def _grpc_log_provider(kind: str, f: Fields) -> GrpcAccessLogProvider:
    def names(key: str) -> tuple[str, ...]:
        return tuple(v for _, v in f.get_strs(key))

    headers: dict[str, tuple[str, ...]] = {}
    if kind == HTTP_ALS:
        for key in (
            "additionalRequestHeadersToLog",
            "additionalResponseHeadersToLog",
            "additionalResponseTrailersToLog",
        ):
            headers[key] = names(key)
    text, labels = "", None
    if kind == OTEL_ALS:
        # The OTel record has a body and attributes: both may be given.
        text, labels = _log_format(f, exclusive=False)
        f.ignore("resourceDetectors")
    return GrpcAccessLogProvider(
        kind,
        f.get_str("service", required=True),
        f.need_port("port"),
        f.get_str("logName"),
        request_headers=headers.get("additionalRequestHeadersToLog", ()),
        response_headers=headers.get("additionalResponseHeadersToLog", ()),
        response_trailers=headers.get("additionalResponseTrailersToLog", ()),
        filter_state_objects=names("filterStateObjectsToLog"),
        text=text,
        labels=labels,
    )


def _log_format(f: Fields, *, exclusive: bool) -> tuple[str, Labels | None]:
    """`logFormat`: its `text` and its `labels` (key -> Envoy command operator)."""
    text, labels = "", None
    fmt = f.get_map("logFormat")
    if fmt is not None:
        text = fmt.get_str("text")
        labels_raw = fmt.raw("labels")
        if labels_raw is not None:
            labels = labels_of(_json_labels(fmt, labels_raw))
        if exclusive and text and labels is not None:
            fmt.fail(None, "set text or labels, not both")
        fmt.ignore("omitEmptyValues")
        fmt.finish()
    return text, labels


def _json_labels(f: Fields, value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        f.fail("labels", "must be a mapping of JSON key -> Envoy command operator")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(v, str):
            f.ctx.fail((*f.at("labels"), k), "must be a string (an Envoy command operator)")
        out[k] = v
    return out
