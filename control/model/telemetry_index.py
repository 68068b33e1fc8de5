"""Which telemetry applies to a proxy: Telemetry objects at three levels plus the mesh config,
merged as Istio merges them (pilot/pkg/model/telemetry.go). Sans-IO, memoized per
(namespace, labels) for one snapshot.

Levels, lowest precedence first: the root namespace's Telemetry without selector (mesh),
the proxy namespace's one without selector, then the first (by name) in the proxy's
namespace whose selector matches its labels (workload). More than one at a level: the
first by name is used, as for Sidecars.

- Access logging, per side (CLIENT / SERVER): each level's entries whose `match.mode`
  covers the side are walked in order; an entry's providers (or, without any, the ones in
  force above it, starting from `defaultProviders.accessLogging`) are enabled, or removed
  when it says `disabled: true`; the last filter given for a provider applies. When no
  Telemetry entry applies and no default provider is set, MeshConfig `accessLogFile` (with
  `accessLogEncoding` / `accessLogFormat`) decides, as Istio's legacy path.
- Tracing, per side: the last level naming providers wins (else `defaultProviders.tracing`),
  its first provider is the tracer; `randomSamplingPercentage` and `disableSpanReporting`
  take the last value set; custom tags merge by tag name, later levels winning. Sampling
  defaults to `defaultConfig.tracing.sampling`. Without Telemetry tracing, default tracing
  providers apply only under `enableTracing`.
- Metrics: the last level naming providers wins (else `defaultProviders.metrics`); without
  `prometheus` among them the proxy reports no standard metrics. The prometheus provider's
  overrides are kept in level order; MetricsSettings.side merges them as Istio does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from control.model.meshconfig import (
    AccessLogEncoding,
    FileAccessLogProvider,
    GrpcAccessLogProvider,
    MeshSettings,
    OpenTelemetryProvider,
    PrometheusProvider,
    ZipkinProvider,
)
from control.model.telemetry import (
    AccessLogging,
    AccessLogSink,
    CodeFilter,
    CustomTag,
    MetricOverride,
    MetricsSettings,
    ProxyTelemetry,
    SideTelemetry,
    Telemetry,
    TracingSettings,
    WorkloadMode,
)
from control.model.types import Labels, workload_selector_matches

logger = logging.getLogger(__name__)

_SIDES = (WorkloadMode.CLIENT, WorkloadMode.SERVER)
_REPORTED: set[tuple[str, str, bool]] = set()


class TelemetryIndex:
    def __init__(self, telemetries: Iterable[Telemetry], mesh: MeshSettings) -> None:
        self.mesh = mesh
        ordered = sorted(telemetries, key=lambda t: (t.namespace, t.name))
        self._namespace_wide: dict[str, Telemetry] = {}
        self._selecting: dict[str, list[Telemetry]] = {}
        for t in ordered:
            if t.selector is None:
                self._namespace_wide.setdefault(t.namespace, t)
            else:
                self._selecting.setdefault(t.namespace, []).append(t)
        self._memo: dict[tuple[str, Labels], ProxyTelemetry] = {}

    def levels(self, namespace: str, labels: Labels) -> tuple[Telemetry, ...]:
        """The Telemetry objects that apply, lowest precedence first."""
        out: list[Telemetry] = []
        root = self._namespace_wide.get(self.mesh.root_namespace)
        if root is not None:
            out.append(root)
        own = self._namespace_wide.get(namespace)
        if own is not None and own is not root:
            out.append(own)
        for t in self._selecting.get(namespace, ()):
            if t.selector is not None and workload_selector_matches(t.selector, labels):
                out.append(t)
                break
        return tuple(out)

    def for_workload(self, namespace: str, labels: Labels) -> ProxyTelemetry:
        key = (namespace, labels)
        found = self._memo.get(key)
        if found is None:
            levels = self.levels(namespace, labels)
            sides = {side: self._side(levels, side) for side in _SIDES}
            found = ProxyTelemetry(
                client=sides[WorkloadMode.CLIENT],
                server=sides[WorkloadMode.SERVER],
                metrics=self._metrics(levels),
            )
            self._memo[key] = found
        return found

    # --- one side ---------------------------------------------------------------------------

    def _side(self, levels: tuple[Telemetry, ...], side: WorkloadMode) -> SideTelemetry:
        return SideTelemetry(
            access_logs=self._access_logs(levels, side), tracing=self._tracing(levels, side)
        )

    def _access_logs(
        self, levels: tuple[Telemetry, ...], side: WorkloadMode
    ) -> tuple[AccessLogSink, ...]:
        mesh = self.mesh
        entries = [a for t in levels for a in t.access_logging if a.mode.covers(side)]
        defaults = mesh.default_providers.access_logging
        if not entries and not defaults:
            if not mesh.access_log_file:
                return ()
            return (
                AccessLogSink(
                    provider="",
                    path=mesh.access_log_file,
                    encoding=mesh.access_log_encoding,
                    text_format=mesh.access_log_format,
                    # A JSON accessLogFormat is a JSON object of labels; Envoy takes it as text
                    # of the right shape, so it stays text here and the builder parses it.
                ),
            )
        chosen = merge_logs(entries, defaults)
        out: list[AccessLogSink] = []
        for name in sorted(chosen):
            sink = self._sink(name, chosen[name])
            if sink is not None:
                out.append(sink)
        return tuple(out)

    def _sink(self, name: str, code_filter: CodeFilter | None) -> AccessLogSink | None:
        provider = self.mesh.provider(name)
        if isinstance(provider, FileAccessLogProvider):
            return AccessLogSink(
                provider=name,
                path=provider.path,
                # As Istio's file provider: labels are JSON, anything else TEXT (its default
                # format when no logFormat is given, whatever accessLogEncoding says).
                encoding=AccessLogEncoding.JSON
                if provider.labels is not None
                else AccessLogEncoding.TEXT,
                text_format=provider.text,
                json_labels=provider.labels,
                filter=code_filter,
            )
        if isinstance(provider, GrpcAccessLogProvider):
            return AccessLogSink(provider=name, path="", filter=code_filter, grpc=provider)
        self._unknown(
            name,
            "an access log provider (envoyFileAccessLog, envoyHttpAls, envoyTcpAls, envoyOtelAls)",
            provider is None,
        )
        return None

    def _tracing(self, levels: tuple[Telemetry, ...], side: WorkloadMode) -> TracingSettings | None:
        mesh = self.mesh
        entries = [tr for t in levels for tr in t.tracing if tr.mode.covers(side)]
        providers = mesh.default_providers.tracing
        if not entries and (not providers or not mesh.enable_tracing):
            return None
        sampling = mesh.default_config.tracing_sampling
        disabled = False
        use_request_id = True
        tags: dict[str, CustomTag] = {}
        for e in entries:
            if e.providers:
                providers = e.providers
            if e.random_sampling_percentage is not None:
                sampling = e.random_sampling_percentage
            if e.disable_span_reporting is not None:
                disabled = e.disable_span_reporting
            if e.use_request_id_for_trace_sampling is not None:
                use_request_id = e.use_request_id_for_trace_sampling
            for tag in e.custom_tags:
                tags[tag.tag] = tag
        if disabled or not providers:
            return None
        name = providers[0]
        provider = mesh.provider(name)
        if not isinstance(provider, ZipkinProvider | OpenTelemetryProvider):
            self._unknown(name, "a tracing provider (zipkin, opentelemetry)", provider is None)
            return None
        return TracingSettings(
            name, provider, sampling, tuple(sorted(tags.values(), key=_tag)), use_request_id
        )

    def _metrics(self, levels: tuple[Telemetry, ...]) -> MetricsSettings:
        defaults = self.mesh.default_providers.metrics
        providers = defaults
        overrides: list[MetricOverride] = []
        interval: float | None = None
        for t in levels:
            for m in t.metrics:
                if m.providers:
                    providers = m.providers
                # As Istio: an entry's overrides are for its providers (the default ones
                # when it names none); only a prometheus provider's shape these metrics.
                if any(self._prometheus(p) for p in m.providers or defaults):
                    overrides.extend(m.overrides)
                if m.reporting_interval is not None:
                    interval = m.reporting_interval
        on = False
        for name in providers:
            if self._prometheus(name):
                on = True
            else:
                provider = self.mesh.provider(name)
                self._unknown(name, "a metrics provider (prometheus)", provider is None)
        return MetricsSettings(tuple(providers), tuple(overrides), interval, on)

    def _prometheus(self, name: str) -> bool:
        return isinstance(self.mesh.provider(name), PrometheusProvider)

    def _unknown(self, name: str, wanted: str, missing: bool) -> None:
        # An index is made per push: said once per process, not once per push.
        key = (name, wanted, missing)
        if key in _REPORTED:
            return
        if len(_REPORTED) > 1000:
            _REPORTED.clear()
        _REPORTED.add(key)
        if missing:
            logger.warning("telemetry provider %r is not defined in the mesh config", name)
        else:
            logger.warning("telemetry provider %r is not %s; not used here", name, wanted)


def _tag(t: CustomTag) -> str:
    return t.tag


def merge_logs(
    entries: list[AccessLogging], defaults: tuple[str, ...]
) -> dict[str, CodeFilter | None]:
    """Istio's mergeLogs: the providers that log, each with its filter (None: everything).
    `entries` are the applicable accessLogging entries of one side, mesh level first."""
    if not entries:
        return dict.fromkeys(defaults)
    names = defaults
    filters: dict[str, CodeFilter] = {}
    for e in entries:
        if e.providers:
            names = e.providers
        if e.filter is not None:
            for p in names:
                filters[p] = e.filter
    in_scope = set(names)
    out: dict[str, CodeFilter | None] = {}
    parent = defaults
    for e in entries:
        current = e.providers or parent
        parent = current
        for p in current:
            if p not in in_scope:
                continue
            if e.disabled:
                out.pop(p, None)
            else:
                out[p] = filters.get(p)
    return out
