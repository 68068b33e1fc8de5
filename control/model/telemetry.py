"""The Telemetry API (`telemetry.istio.io/v1` `Telemetry`) as the model holds it, and the
effective telemetry of one proxy that the generators consume (control/model/telemetry_index.py
computes it).

Everything is frozen and hashable: an effective telemetry is part of the cache key of the
listeners it shapes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from control.model.meshconfig import (
    AccessLogEncoding,
    GrpcAccessLogProvider,
    OpenTelemetryProvider,
    ZipkinProvider,
)
from control.model.types import Labels, SourceRef
from protos.telemetry import HTTP_METRICS, STANDARD_METRICS, TCP_METRICS


class WorkloadMode(enum.StrEnum):
    """`match.mode`: which side of a proxy an entry applies to. Outbound (and gateway)
    listeners are CLIENT, inbound ones SERVER, as in Istio."""

    CLIENT = "CLIENT"
    SERVER = "SERVER"
    CLIENT_AND_SERVER = "CLIENT_AND_SERVER"

    def covers(self, side: WorkloadMode) -> bool:
        return self is WorkloadMode.CLIENT_AND_SERVER or self is side


@dataclass(frozen=True, slots=True)
class CodeFilter:
    """An access-log `filter.expression` that Envoy can run without CEL: comparisons of
    `response.code` with integers, all joined by `&&` (`all_of`) or all by `||`. Each term
    is (operator, value), operator one of == != >= > <= <."""

    terms: tuple[tuple[str, int], ...]
    all_of: bool = True
    expression: str = ""

    def matches(self, code: int) -> bool:
        """What Envoy will decide for a response code (for tests and /debug views)."""
        results = [_compare(code, op, value) for op, value in self.terms]
        return all(results) if self.all_of else any(results)


def _compare(code: int, op: str, value: int) -> bool:
    return {
        "==": code == value,
        "!=": code != value,
        ">=": code >= value,
        ">": code > value,
        "<=": code <= value,
        "<": code < value,
    }[op]


@dataclass(frozen=True, slots=True)
class AccessLogging:
    """One `accessLogging[]` entry. `disabled` None: not said (enables its providers)."""

    providers: tuple[str, ...] = ()
    disabled: bool | None = None
    filter: CodeFilter | None = None
    mode: WorkloadMode = WorkloadMode.CLIENT_AND_SERVER


class CustomTagKind(enum.StrEnum):
    LITERAL = "literal"
    HEADER = "header"
    ENVIRONMENT = "environment"


@dataclass(frozen=True, slots=True)
class CustomTag:
    """`customTags.<tag>`: a literal value, a request header or an environment variable of
    the proxy (with `defaultValue` when it is absent)."""

    tag: str
    kind: CustomTagKind
    value: str  # the literal, the header name or the variable name
    default: str = ""


@dataclass(frozen=True, slots=True)
class Tracing:
    """One `tracing[]` entry; None fields were not set (a lower level inherits them)."""

    providers: tuple[str, ...] = ()
    random_sampling_percentage: float | None = None
    custom_tags: tuple[CustomTag, ...] = ()
    disable_span_reporting: bool | None = None
    use_request_id_for_trace_sampling: bool | None = None
    mode: WorkloadMode = WorkloadMode.CLIENT_AND_SERVER


@dataclass(frozen=True, slots=True)
class TagOverride:
    tag: str
    operation: str  # UPSERT | REMOVE
    value: str = ""  # UPSERT: a CEL expression (kept as text for the metrics consumer)


@dataclass(frozen=True, slots=True)
class MetricOverride:
    """`metrics[].overrides[]`: `metric` is Istio's enum name (REQUEST_COUNT, ...,
    ALL_METRICS), or a custom metric name."""

    metric: str = "ALL_METRICS"
    mode: WorkloadMode = WorkloadMode.CLIENT_AND_SERVER
    disabled: bool | None = None
    tag_overrides: tuple[TagOverride, ...] = ()


@dataclass(frozen=True, slots=True)
class Metrics:
    providers: tuple[str, ...] = ()
    overrides: tuple[MetricOverride, ...] = ()
    reporting_interval: float | None = None


@dataclass(frozen=True, slots=True)
class Telemetry:
    """A `Telemetry` object. `selector` None: the whole namespace (the mesh, in the root
    namespace)."""

    namespace: str
    name: str
    source: SourceRef = field(compare=False)
    selector: Labels | None = None
    access_logging: tuple[AccessLogging, ...] = ()
    tracing: tuple[Tracing, ...] = ()
    metrics: tuple[Metrics, ...] = ()


# --- effective telemetry of one proxy -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AccessLogSink:
    """One Envoy access log: where, in which format, for which responses. A file (`path`),
    or, with `grpc` set, a gRPC access log service (`path` and the formats unused)."""

    provider: str
    path: str
    encoding: AccessLogEncoding = AccessLogEncoding.TEXT
    text_format: str = ""  # "": Istio's default TEXT format
    json_labels: Labels | None = None  # None: Istio's default JSON labels
    filter: CodeFilter | None = None
    grpc: GrpcAccessLogProvider | None = None


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """The tracer of one side of a proxy: one provider (Envoy runs one tracer per HCM)."""

    provider_name: str
    provider: ZipkinProvider | OpenTelemetryProvider
    sampling: float  # percent
    custom_tags: tuple[CustomTag, ...] = ()
    # Telemetry useRequestIdForTraceSampling: the x-request-id carries the decision between
    # hops (Envoy's default); False: each hop samples on its own.
    use_request_id: bool = True


@dataclass(frozen=True, slots=True)
class SideTelemetry:
    """What the listeners of one side (CLIENT: outbound and gateway; SERVER: inbound) get."""

    access_logs: tuple[AccessLogSink, ...] = ()
    tracing: TracingSettings | None = None


PROMETHEUS = "prometheus"


@dataclass(frozen=True, slots=True)
class SideMetrics:
    """The standard metrics of one side of a proxy after the overrides: which are not
    exported, and the labels each one drops."""

    disabled: frozenset[str] = frozenset()
    removed: tuple[tuple[str, frozenset[str]], ...] = ()  # (metric, labels), by metric

    @property
    def http_off(self) -> bool:
        return self.disabled.issuperset(HTTP_METRICS)

    @property
    def tcp_off(self) -> bool:
        return self.disabled.issuperset(TCP_METRICS)


NO_METRIC_OVERRIDES = SideMetrics()


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    """The metrics in effect for a proxy, for the standard-metrics code: the providers
    (`prometheus` = Istio's standard metrics) and the prometheus provider's overrides in
    precedence order (root, namespace, workload; within one, as written: later ones win)."""

    providers: tuple[str, ...] = (PROMETHEUS,)
    overrides: tuple[MetricOverride, ...] = ()
    reporting_interval: float | None = None
    # Whether one of `providers` is a prometheus provider (the mesh config says which are).
    prometheus: bool = True

    def enabled(self, metric: str, mode: WorkloadMode) -> bool:
        """Whether a standard metric is reported on one side (`disabled` overrides)."""
        if not self.prometheus:
            return False
        return metric not in self.side(mode).disabled

    def side(self, mode: WorkloadMode) -> SideMetrics:
        """Istio's merge for one side: each override, in order, sets `disabled` (when it
        says) and its tag operations (by tag name) on every metric it matches."""
        disabled: dict[str, bool] = {}
        tags: dict[str, dict[str, str]] = {}
        for o in self.overrides:
            if not o.mode.covers(mode):
                continue
            metrics = STANDARD_METRICS if o.metric == "ALL_METRICS" else (o.metric,)
            for m in metrics:
                if m not in STANDARD_METRICS:
                    continue  # a custom metric: none is produced here
                if o.disabled is not None:
                    disabled[m] = o.disabled
                for tag in o.tag_overrides:
                    tags.setdefault(m, {})[tag.tag] = tag.operation
        removed = tuple(
            (m, frozenset(t for t, op in ops.items() if op == "REMOVE"))
            for m, ops in sorted(tags.items())
            if "REMOVE" in ops.values() and not disabled.get(m, False)
        )
        return SideMetrics(frozenset(m for m, off in disabled.items() if off), removed)


@dataclass(frozen=True, slots=True)
class ProxyTelemetry:
    client: SideTelemetry = SideTelemetry()
    server: SideTelemetry = SideTelemetry()
    metrics: MetricsSettings = MetricsSettings()

    def side(self, mode: WorkloadMode) -> SideTelemetry:
        return self.server if mode is WorkloadMode.SERVER else self.client


NO_TELEMETRY = ProxyTelemetry()
