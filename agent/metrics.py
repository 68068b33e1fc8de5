"""Agent metrics, with Istio's `istio_agent_*` names where one exists.

One `AgentMetrics` per agent, passed to the components that record into it (no module globals,
so tests can run several agents in one process). The exposition is prometheus_client's (it
adds `_total` to counter names, `istio_agent_xds_proxy_requests_total`, and `_created`
samples, as the control plane's metrics have), but the values are kept here, in
`MetricsRegistry`: prometheus_client is imported at the first scrape, not at start. Importing
it (and the HTTP servers, email and urllib modules its package pulls in) took ~45 ms of CPU,
a fifth of the agent's start before its first xDS request (issue 23). Metrics Istio's agent
does not have are named `pilotfish_agent_*`.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric as Family

# What `render()` returns (Prometheus text format 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Collector(Protocol):
    """What `MetricsRegistry.register` takes: prometheus_client's collector protocol."""

    def collect(self) -> Iterator[Family]: ...


class _Value:
    """One series: a counter's or gauge's value (or a function giving it at scrape time)."""

    __slots__ = ("created", "function", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()
        self.function: Callable[[], float] | None = None

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def set(self, value: float) -> None:
        self.value = float(value)

    def set_function(self, function: Callable[[], float]) -> None:
        self.function = function

    def get(self) -> float:
        return float(self.function()) if self.function is not None else self.value


class _Buckets:
    """One histogram series: a count per bucket (the last one +Inf) and the sum."""

    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0.0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        # `le` buckets: a value equal to a bound counts in that bucket; the last is +Inf.
        self.counts[min(bisect.bisect_left(self.bounds, value), len(self.bounds) - 1)] += 1
        self.sum += value


class _Metric:
    """A metric family: its series by label values (`labels(...)`); one without labels is
    its own single series."""

    kind = ""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: MetricsRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._series: dict[tuple[str, ...], _Value | _Buckets] = {}
        if not self.labelnames:
            self._series[()] = self._new()
        registry.register(self)

    def _new(self) -> _Value | _Buckets:
        return _Value()

    def _child(self, *values: object, **named: object) -> _Value | _Buckets:
        if named:
            values = tuple(named[n] for n in self.labelnames)
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
        key = tuple(str(v) for v in values)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = self._new()
        return series

    def _family(self, family: type[Family], typ: str) -> Family:
        return family(self.name, self.documentation, typ)

    def collect(self) -> Iterator[Family]:
        raise NotImplementedError


class Counter(_Metric):
    def labels(self, *values: object, **named: object) -> _Value:
        child = self._child(*values, **named)
        assert isinstance(child, _Value)
        return child

    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)

    def collect(self) -> Iterator[Family]:
        from prometheus_client.metrics_core import Metric

        m = self._family(Metric, "counter")
        for key, series in self._series.items():
            assert isinstance(series, _Value)
            labels = dict(zip(self.labelnames, key, strict=True))
            m.add_sample(self.name + "_total", labels, series.get())
            m.add_sample(self.name + "_created", labels, series.created)
        yield m


class Gauge(Counter):
    def set(self, value: float) -> None:
        self.labels().set(value)

    def set_function(self, function: Callable[[], float]) -> None:
        self.labels().set_function(function)

    def collect(self) -> Iterator[Family]:
        from prometheus_client.metrics_core import Metric

        m = self._family(Metric, "gauge")
        for key, series in self._series.items():
            assert isinstance(series, _Value)
            m.add_sample(self.name, dict(zip(self.labelnames, key, strict=True)), series.get())
        yield m


class Histogram(_Metric):
    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: MetricsRegistry,
    ) -> None:
        self._bounds = (*sorted(float(b) for b in buckets if b != math.inf), math.inf)
        super().__init__(name, documentation, labelnames, registry=registry)

    def _new(self) -> _Buckets:
        return _Buckets(self._bounds)

    def labels(self, *values: object, **named: object) -> _Buckets:
        child = self._child(*values, **named)
        assert isinstance(child, _Buckets)
        return child

    def collect(self) -> Iterator[Family]:
        from prometheus_client.metrics_core import Metric
        from prometheus_client.utils import floatToGoString

        m = self._family(Metric, "histogram")
        for key, series in self._series.items():
            assert isinstance(series, _Buckets)
            labels = dict(zip(self.labelnames, key, strict=True))
            total = 0.0
            for bound, count in zip(series.bounds, series.counts, strict=True):
                total += count
                le = floatToGoString(bound)  # type: ignore[no-untyped-call]
                m.add_sample(self.name + "_bucket", {**labels, "le": le}, total)
            m.add_sample(self.name + "_count", labels, total)
            m.add_sample(self.name + "_sum", labels, series.sum)
            m.add_sample(self.name + "_created", labels, series.created)
        yield m


class MetricsRegistry:
    """The agent's metrics and any other collectors (the standard metrics' aggregator), in
    the order they were registered, which is the exposition's order."""

    def __init__(self) -> None:
        self._collectors: list[Collector] = []

    def register(self, collector: Collector) -> None:
        self._collectors.append(collector)

    def collect(self) -> Iterator[Family]:
        for c in self._collectors:
            yield from c.collect()

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self)  # type: ignore[arg-type]


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = MetricsRegistry()
        r = self.registry
        self.xds_proxy_requests = Counter(
            "istio_agent_xds_proxy_requests",
            "xDS requests relayed from downstream streams to the control plane, by type.",
            ["type"],
            registry=r,
        )
        self.xds_proxy_responses = Counter(
            "istio_agent_xds_proxy_responses",
            "xDS responses received from the control plane, by type.",
            ["type"],
            registry=r,
        )
        self.xds_upstream_errors = Counter(
            "pilotfish_agent_xds_upstream_errors",
            "Upstream streams or channel attempts that failed, by class (expected|unexpected).",
            ["class"],
            registry=r,
        )
        self.xds_upstream_reconnects = Counter(
            "pilotfish_agent_xds_upstream_reconnects",
            "Times the upstream channel to the control plane was re-established.",
            registry=r,
        )
        self.xds_downstream_streams = Gauge(
            "pilotfish_agent_xds_downstream_streams",
            "Open downstream xDS streams (Envoy and proxyless gRPC clients).",
            registry=r,
        )
        self.handler_nacks = Counter(
            "pilotfish_agent_handler_nacks",
            "Responses NACKed by an agent-side ResponseHandler, by type.",
            ["type"],
            registry=r,
        )
        self.startup_duration = Gauge(
            "istio_agent_startup_duration_seconds",
            "Seconds from the agent's start until it was first ready.",
            registry=r,
        )
        # Istio's names for the /stats/prometheus merge; `type` is the source ("envoy").
        self.scrapes = Counter(
            "istio_agent_scrapes",
            "Scrapes of the merged /stats/prometheus endpoint.",
            registry=r,
        )
        self.scrape_failures = Counter(
            "istio_agent_scrape_failures",
            "Sources that could not be fetched while serving /stats/prometheus, by type.",
            ["type"],
            registry=r,
        )

        # Workload certificates (agent/sds), with Istio's names where it has them.
        self.outgoing_requests = Counter(
            "istio_agent_num_outgoing_requests",
            "Requests the agent sent to the CA, by request_type (csr).",
            ["request_type"],
            registry=r,
        )
        self.failed_outgoing_requests = Counter(
            "istio_agent_num_failed_outgoing_requests",
            "Requests to the CA that failed, by request_type (csr).",
            ["request_type"],
            registry=r,
        )
        self.certs_issued = Counter(
            "pilotfish_agent_certs_issued",
            "Workload certificates installed (the first one and every rotation).",
            registry=r,
        )
        self.cert_rotations = Counter(
            "pilotfish_agent_cert_rotations",
            "Workload certificates installed to replace a previous one.",
            registry=r,
        )
        self.file_secret_failures = Counter(
            "istio_agent_num_file_secret_failures",
            "File-mounted secrets (file-cert:, file-root:) that could not be read or parsed.",
            registry=r,
        )
        self.cert_expiry = Gauge(
            "istio_agent_cert_expiry_seconds",
            "Seconds until the workload certificate expires, by resource_name.",
            ["resource_name"],
            registry=r,
        )

    def render(self) -> bytes:
        return self.registry.render()


class MetricsObserver:
    """Feeds the xDS proxy's events into `AgentMetrics` (see relay.RelayObserver)."""

    def __init__(self, metrics: AgentMetrics) -> None:
        self._m = metrics

    def request(self, type_url: str) -> None:
        self._m.xds_proxy_requests.labels(short_type(type_url)).inc()

    def response(self, type_url: str) -> None:
        self._m.xds_proxy_responses.labels(short_type(type_url)).inc()

    def upstream_error(self, kind: str) -> None:
        self._m.xds_upstream_errors.labels(kind).inc()

    def nack(self, type_url: str) -> None:
        self._m.handler_nacks.labels(short_type(type_url)).inc()

    def streams(self, delta: int) -> None:
        self._m.xds_downstream_streams.inc(delta)


def short_type(type_url: str) -> str:
    """The message name of a type URL: Istio's metrics use short type labels."""
    return type_url.rpartition("/")[2].rpartition(".")[2] or "unknown"


class SdsMetricsObserver:
    """Feeds the secret manager's events into `AgentMetrics` (see
    agent.sds.workloadcert.SdsObserver)."""

    def __init__(self, metrics: AgentMetrics, clock: Callable[[], float] = time.time) -> None:
        self._m = metrics
        self._clock = clock
        self._not_after: float | None = None
        # Computed at scrape time, so the gauge counts down between rotations.
        metrics.cert_expiry.labels("default").set_function(self._remaining)

    def _remaining(self) -> float:
        if self._not_after is None:
            return 0.0
        return self._not_after - self._clock()

    def sign_attempt(self) -> None:
        self._m.outgoing_requests.labels("csr").inc()

    def cert_issued(self, not_after: float, *, rotation: bool) -> None:
        self._not_after = not_after
        self._m.certs_issued.inc()
        if rotation:
            self._m.cert_rotations.inc()

    def signing_failed(self, *, retryable: bool) -> None:
        self._m.failed_outgoing_requests.labels("csr").inc()

    def file_secret_failed(self) -> None:
        self._m.file_secret_failures.inc()
