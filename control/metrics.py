"""Control-plane metrics, with Istio's names, types, labels and buckets where one exists.

One `Metrics` object per process, passed to the components that record into it (no module
globals, so tests can run several control planes in one process). Rendered as istiod renders
them (control/promtext.py): counters without a `_total` suffix (`pilot_xds_pushes`). Metrics
Istio does not have are named `pilotfish_*`.
"""

from __future__ import annotations

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.process_collector import ProcessCollector

from control.loopmetrics import LoopCounter, LoopHistogram
from control.promtext import istio_exposition
from protos import typeurls

# istiod's buckets (pilot/pkg/xds/monitoring.go): dashboards' quantiles assume them. The
# histograms observed on every push to every stream are LoopHistograms, and the counter counted
# on every write a LoopCounter (control/loopmetrics.py).
_PUSH_BUCKETS = (0.01, 0.1, 1, 3, 5, 10, 20, 30)
_CONVERGENCE_BUCKETS = (0.1, 0.5, 1, 3, 5, 10, 20, 30)
# 4 MB is gRPC's default message limit, 10 MB strains a proxy, 40 MB is about the most any
# proxy takes (istiod's reasoning for these boundaries).
_SIZE_BUCKETS = (1, 10_000, 1_000_000, 4_000_000, 10_000_000, 40_000_000)

# Istio's `type` label values (v3.GetMetricType); any other type is labelled by its URL.
_METRIC_TYPES = {
    typeurls.CLUSTER: "cds",
    typeurls.LISTENER: "lds",
    typeurls.ROUTE: "rds",
    typeurls.ENDPOINT: "eds",
    typeurls.SECRET: "sds",
    typeurls.NAME_TABLE: "nds",
    typeurls.PROXY_CONFIG: "pcds",
}

# Why a push started (PushLoop reasons) -> Istio's TriggerReason values.
_TRIGGERS = {"config": "config", "registry": "endpoint", "manual": "debug", "unknown": "unknown"}

# Istio's listener-conflict gauges (pilot/pkg/model/push_context.go) and the duplicate-domain
# one; each counts the distinct conflicts met while generating the current push.
CONFLICT_INBOUND = "pilot_conflict_inbound_listener"
CONFLICT_TCP_OVER_TCP = "pilot_conflict_outbound_listener_tcp_over_current_tcp"
CONFLICT_TCP_OVER_HTTP = "pilot_conflict_outbound_listener_tcp_over_current_http"
CONFLICT_HTTP_OVER_TCP = "pilot_conflict_outbound_listener_http_over_current_tcp"
DUPLICATE_DOMAIN = "pilot_vservice_dup_domain"
CONFLICT_HELP = {
    CONFLICT_INBOUND: "Number of conflicting inbound listeners.",
    CONFLICT_TCP_OVER_TCP: "Number of conflicting tcp listeners with current tcp listener.",
    CONFLICT_TCP_OVER_HTTP: (
        "Number of conflicting wildcard tcp listeners with current wildcard http listener."
    ),
    CONFLICT_HTTP_OVER_TCP: (
        "Number of conflicting wildcard http listeners with current wildcard tcp listener."
    ),
    DUPLICATE_DOMAIN: "Virtual services with dup domains.",
}


def metric_type(type_url: str) -> str:
    return _METRIC_TYPES.get(type_url, type_url)


def trigger(reason: str) -> str:
    return _TRIGGERS.get(reason, reason)


def grpc_code_name(code: int) -> str:
    """A status code as Go's codes.Code.String() spells it (Istio's `err` label)."""
    for status in grpc.StatusCode:
        if status.value[0] == code:
            if status is grpc.StatusCode.CANCELLED:
                return "Canceled"
            if status is grpc.StatusCode.OK:
                return "OK"
            return str(status.name).title().replace("_", "")
    return f"Code({code})"


class Metrics:
    def __init__(self, version: str = "") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # Process metrics keep their standard names (process_cpu_seconds_total): a registry
        # of their own, rendered plainly.
        self.runtime = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.runtime)
        r = self.registry
        self.build = Gauge(
            "istio_build", "Istio component build info", ["component", "tag"], registry=r
        )
        self.build.labels("pilot", version or _version()).set(1)
        self.xds_clients = Gauge(
            "pilot_xds",
            "Number of endpoints connected to this pilot using XDS.",
            ["version"],
            registry=r,
        )
        self.pushes = LoopCounter(
            "pilot_xds_pushes",
            "Pilot build and send errors for lds, rds, cds and eds.",
            ["type"],
            registry=r,
        )
        self.push_time = LoopHistogram(
            "pilot_xds_push_time",
            "Total time in seconds Pilot takes to push lds, rds, cds and eds.",
            ["type"],
            buckets=_PUSH_BUCKETS,
            registry=r,
        )
        self.send_time = LoopHistogram(
            "pilot_xds_send_time",
            "Total time in seconds Pilot takes to send generated configuration.",
            buckets=_PUSH_BUCKETS,
            registry=r,
        )
        self.write_timeouts = Counter(
            "pilot_xds_write_timeout", "Pilot XDS response write timeouts.", registry=r
        )
        self.internal_errors = Counter(
            "pilot_total_xds_internal_errors",
            "Total number of internal XDS errors in pilot.",
            registry=r,
        )
        self.rejects = Counter(
            "pilot_total_xds_rejects",
            "Total number of XDS responses from pilot rejected by proxy.",
            ["type"],
            registry=r,
        )
        # Istio keeps these per-type gauges for older dashboards (pilot_total_xds_rejects is
        # the one to use); a proxy's series go when its last stream closes.
        self.type_rejects = {
            t: Gauge(
                f"pilot_xds_{t}_reject", f"Pilot rejected {t.upper()}.", ["node", "err"], registry=r
            )
            for t in ("cds", "eds", "lds", "rds")
        }
        self.stale_requests = Counter(
            "pilot_xds_expired_nonce",
            "Total number of XDS requests with an expired nonce.",
            ["type"],
            registry=r,
        )
        # Observed per pushed type when the proxy ACKs it, from the start of the oldest push
        # the response carries (an ACK is the proof the proxy has the configuration).
        self.convergence = LoopHistogram(
            "pilot_proxy_convergence_time",
            "Delay in seconds between config change and a proxy receiving all required "
            "configuration.",
            buckets=_CONVERGENCE_BUCKETS,
            registry=r,
        )
        self.queue_time = LoopHistogram(
            "pilot_proxy_queue_time",
            "Time in seconds, a proxy is in the push queue before being dequeued.",
            buckets=_CONVERGENCE_BUCKETS,
            registry=r,
        )
        self.push_context_init = Histogram(
            "pilot_pushcontext_init_seconds",
            "Total time in seconds Pilot takes to init pushContext.",
            buckets=(0.01, 0.1, 0.5, 1, 3, 5),
            registry=r,
        )
        self.debounce = Histogram(
            "pilot_debounce_time",
            "Delay in seconds between the first config enters debouncing and the merged push "
            "request is pushed into the push queue.",
            buckets=_PUSH_BUCKETS,
            registry=r,
        )
        self.push_triggers = Counter(
            "pilot_push_triggers",
            "Total number of times a push was triggered, labeled by reason for the push.",
            ["type"],
            registry=r,
        )
        self.eds_only_pushes = Counter(
            "pilotfish_eds_only_pushes",
            "Pushes that sent only endpoints (only workloads changed).",
            registry=r,
        )
        self.config_size = Histogram(
            "pilot_xds_config_size_bytes",
            "Distribution of configuration sizes pushed to clients",
            ["type"],
            buckets=_SIZE_BUCKETS,
            registry=r,
        )
        self.rate_limited = Counter(
            "pilotfish_xds_connections_rate_limited",
            "New streams that waited for admission (connection storm control).",
            registry=r,
        )
        self.admission_rate = Gauge(
            "pilotfish_xds_admission_rate",
            "New streams admitted per second now (adapts to event-loop lag, memory growth "
            "and the send queue).",
            registry=r,
        )
        self.admission_slowdowns = Counter(
            "pilotfish_xds_admission_slowdowns",
            "Times the admission rate went down, by reason (lag: the event loop ran late; "
            "rss: memory grew too fast).",
            ["reason"],
            registry=r,
        )
        self.serializations = Counter(
            "pilotfish_xds_resource_serializations",
            "Resources serialized (each is shared by every proxy that receives it).",
            registry=r,
        )
        self.services = Gauge("pilot_services", "Total services known to pilot.", registry=r)
        self.virtual_services = Gauge(
            "pilot_virt_services", "Total virtual services known to pilot.", registry=r
        )
        self.conflicts = {
            name: Gauge(name, help, registry=r) for name, help in CONFLICT_HELP.items()
        }
        self.k8s_reg_events = Counter(
            "pilot_k8s_reg_events", "Events from k8s registry.", ["type", "event"], registry=r
        )
        self.k8s_cfg_events = Counter(
            "pilot_k8s_cfg_events", "Events from k8s config.", ["type", "event"], registry=r
        )
        self.config_errors = Gauge(
            "pilotfish_config_file_errors", "Config files currently rejected.", registry=r
        )
        self.stream_errors = Counter(
            "pilotfish_xds_stream_errors",
            "Streams that ended with an error, by class.",
            ["class"],
            registry=r,
        )
        self.injection_requests = Counter(
            "sidecar_injection_requests_total",
            "Total number of sidecar injection requests.",
            registry=r,
        )
        self.injection_success = Counter(
            "sidecar_injection_success_total",
            "Total number of successful sidecar injection requests.",
            registry=r,
        )
        self.injection_skip = Counter(
            "sidecar_injection_skip_total",
            "Total number of skipped sidecar injection requests.",
            registry=r,
        )
        self.injection_failure = Counter(
            "sidecar_injection_failure_total",
            "Total number of failed sidecar injection requests.",
            registry=r,
        )
        self.csr_count = Counter(
            "citadel_server_csr_count", "The number of CSRs received by Citadel server.", registry=r
        )
        self.cert_issued = Counter(
            "citadel_server_success_cert_issuance_count",
            "The number of certificates issuances that have succeeded.",
            registry=r,
        )
        self.csr_auth_errors = Counter(
            "citadel_server_authentication_failure_count",
            "The number of authentication failures.",
            registry=r,
        )
        self.csr_parse_errors = Counter(
            "citadel_server_csr_parsing_err_count",
            "The number of errors occurred when parsing the CSR.",
            registry=r,
        )
        self.csr_sign_errors = Counter(
            "citadel_server_csr_sign_err_count",
            "The number of errors occurred when signing the CSR.",
            registry=r,
        )
        self.signer_restarts = Counter(
            "pilotfish_ca_signer_restarts",
            "Signing worker processes started again after one exited.",
            registry=r,
        )
        self.root_expiry = Gauge(
            "citadel_server_root_cert_expiry_timestamp",
            "The unix timestamp, in seconds, when Citadel root cert will expire.",
            registry=r,
        )
        self.xds_auth_failures = Counter(
            "pilotfish_xds_auth_failures",
            "xDS streams on the TLS port refused, by status.",
            ["code"],
            registry=r,
        )
        self.registrations_refused = Counter(
            "pilotfish_auto_registrations_refused",
            "Proxies that named a WorkloadGroup and were not registered, by reason.",
            ["reason"],
            registry=r,
        )

    def render(self) -> bytes:
        return istio_exposition(self.registry) + generate_latest(self.runtime)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pilotfish")
    except PackageNotFoundError:
        return "unknown"
