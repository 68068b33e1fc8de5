"""Agent metrics, with Istio's `istio_agent_*` names where one exists.

One `AgentMetrics` per agent, passed to the components that record into it (no module globals,
so tests can run several agents in one process). prometheus_client adds `_total` to counter
names in the exposition (`istio_agent_xds_proxy_requests_total`), as the control plane's
metrics do. Metrics Istio's agent does not have are named `pilotfish_agent_*`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

# What `render()` returns (Prometheus text format 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
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
        return generate_latest(self.registry)


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
    """Feeds the secret manager's events into `AgentMetrics` (see agent.sds.secrets.SdsObserver)."""

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
