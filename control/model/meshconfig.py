"""Istio's MeshConfig, typed: the mesh-wide settings of `--mesh-config` (and, in Kubernetes
mode, the `mesh` key of the ConfigMap `istio`), with Istio's field names and defaults.

Called `MeshSettings` here because `MeshConfig` in control/model/types.py already names the
snapshot of config objects. Everything is frozen and hashable: the settings are part of what a
push is built from (MeshIndex compares them, generators key cached resources on parts of them).
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Final

from control.model.traffic import LocalityLbSetting
from control.model.types import ConfigWarning, Labels

# Istio's default mesh config turns locality load balancing on.
LOCALITY_LB_DEFAULT: Final = LocalityLbSetting(enabled=True)


class AccessLogEncoding(enum.StrEnum):
    TEXT = "TEXT"
    JSON = "JSON"


@dataclass(frozen=True, slots=True)
class FileAccessLogProvider:
    """`envoyFileAccessLog`: Envoy's file logger. `text`/`labels` are its `logFormat` (both
    unset: Istio's default TEXT format)."""

    path: str = "/dev/stdout"
    text: str = ""
    labels: Labels | None = None  # JSON: label -> Envoy command operator


HTTP_ALS = "envoyHttpAls"
TCP_ALS = "envoyTcpAls"
OTEL_ALS = "envoyOtelAls"


@dataclass(frozen=True, slots=True)
class GrpcAccessLogProvider:
    """`envoyHttpAls` / `envoyTcpAls` (Envoy's gRPC access log service) and `envoyOtelAls`
    (OTLP LogsService): Envoy's gRPC loggers to a collector at `service:port`. The header
    lists are the HTTP service's `additional*ToLog`; `text`/`labels` the OTel one's
    `logFormat` (the log record's body and attributes)."""

    kind: str  # the Istio field name: HTTP_ALS, TCP_ALS or OTEL_ALS
    service: str
    port: int
    log_name: str = ""
    request_headers: tuple[str, ...] = ()
    response_headers: tuple[str, ...] = ()
    response_trailers: tuple[str, ...] = ()
    filter_state_objects: tuple[str, ...] = ()
    text: str = ""
    labels: Labels | None = None


@dataclass(frozen=True, slots=True)
class ZipkinProvider:
    """`zipkin`: Envoy's Zipkin tracer reporting JSON v2 spans over HTTP."""

    service: str
    port: int
    max_tag_length: int = 0  # 0: Envoy's default (256)
    enable_64bit_trace_id: bool = False
    path: str = "/api/v2/spans"


@dataclass(frozen=True, slots=True)
class OpenTelemetryProvider:
    """`opentelemetry`: Envoy's OpenTelemetry tracer exporting OTLP over gRPC (`grpc`) or
    HTTP (`http`, parsed; only gRPC is generated)."""

    service: str
    port: int
    max_tag_length: int = 0
    http_path: str = ""  # set: the `http` exporter was asked for
    timeout: float = 0.0  # grpc.timeout; 0 = Envoy's default


@dataclass(frozen=True, slots=True)
class PrometheusProvider:
    """`prometheus`: the standard metrics (served by the agent; see issue 20 item 3)."""


Provider = (
    FileAccessLogProvider
    | GrpcAccessLogProvider
    | ZipkinProvider
    | OpenTelemetryProvider
    | PrometheusProvider
)

TRACING_PROVIDERS = (ZipkinProvider, OpenTelemetryProvider)
ACCESS_LOG_PROVIDERS = (FileAccessLogProvider, GrpcAccessLogProvider)


@dataclass(frozen=True, slots=True)
class ExtensionProvider:
    name: str
    provider: Provider


@dataclass(frozen=True, slots=True)
class DefaultProviders:
    """`defaultProviders`: the providers used where no Telemetry names any."""

    metrics: tuple[str, ...] = ("prometheus",)
    tracing: tuple[str, ...] = ()
    access_logging: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ProxyDefaults:
    """`defaultConfig` (Istio's ProxyConfig): the fields pilotfish uses."""

    # None: not set, the agent's own default applies (Istio's is 45s; pilotfish's agent
    # drains for 5s unless told).
    drain_duration: float | None = None
    hold_application_until_proxy_starts: bool = False
    proxy_metadata: Labels = ()
    tracing_sampling: float = 1.0  # tracing.sampling, percent


# Istio's built-in providers: what `envoy` and `prometheus` name when the mesh config does not
# define them itself.
BUILTIN_PROVIDERS: tuple[ExtensionProvider, ...] = (
    ExtensionProvider("prometheus", PrometheusProvider()),
    ExtensionProvider("envoy", FileAccessLogProvider()),
)


@dataclass(frozen=True, slots=True)
class MeshSettings:
    """One version of the mesh config, defaults filled in as Istio fills them."""

    access_log_file: str = ""  # "": no access log unless a Telemetry asks for one
    access_log_encoding: AccessLogEncoding = AccessLogEncoding.TEXT
    access_log_format: str = ""  # "": Istio's default for the encoding
    enable_tracing: bool = True
    default_config: ProxyDefaults = field(default_factory=ProxyDefaults)
    extension_providers: tuple[ExtensionProvider, ...] = BUILTIN_PROVIDERS
    default_providers: DefaultProviders = field(default_factory=DefaultProviders)
    outbound_traffic_policy: str = "ALLOW_ANY"
    trust_domain: str = "cluster.local"
    root_namespace: str = "istio-system"
    # Istio's default: locality load balancing on, for the DestinationRules with outlier
    # detection (failover needs it to notice that local endpoints are gone).
    locality_lb: LocalityLbSetting | None = LOCALITY_LB_DEFAULT
    # Where it came from ("" = defaults) and what loading it reported; not part of equality.
    source: str = field(default="", compare=False)
    warnings: tuple[ConfigWarning, ...] = field(default=(), compare=False)

    def as_json(self) -> dict[str, object]:
        """The settings in effect, for /debug/configz."""
        out = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("source", "warnings", "extension_providers")
        }
        out["default_config"] = asdict(self.default_config)
        out["default_providers"] = asdict(self.default_providers)
        out["locality_lb"] = None if self.locality_lb is None else asdict(self.locality_lb)
        out["extension_providers"] = [
            {"name": p.name, "kind": type(p.provider).__name__, **asdict(p.provider)}
            for p in self.extension_providers
        ]
        return out

    def provider(self, name: str) -> Provider | None:
        for p in self.extension_providers:
            if p.name == name:
                return p.provider
        return None


DEFAULT_MESH = MeshSettings()


@dataclass(frozen=True, slots=True)
class MeshOverrides:
    """Settings the control plane's flags fix: each one set (not None) wins over the mesh
    config (DESIGN: flags win over it)."""

    trust_domain: str | None = None
    outbound_traffic_policy: str | None = None
    hold_application_until_proxy_starts: bool | None = None

    def apply(self, mesh: MeshSettings) -> MeshSettings:
        out = mesh
        if self.trust_domain is not None:
            out = replace(out, trust_domain=self.trust_domain)
        if self.outbound_traffic_policy is not None:
            out = replace(out, outbound_traffic_policy=self.outbound_traffic_policy)
        if self.hold_application_until_proxy_starts is not None:
            out = replace(
                out,
                default_config=replace(
                    out.default_config,
                    hold_application_until_proxy_starts=self.hold_application_until_proxy_starts,
                ),
            )
        return out
