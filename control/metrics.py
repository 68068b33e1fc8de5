"""Control-plane metrics, with Istio's metric names where one exists.

One `Metrics` object per process, passed to the components that record into it (no module
globals, so tests can run several control planes in one process).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.xds_clients = Gauge("pilot_xds", "Connected xDS streams.", ["version"], registry=r)
        self.pushes = Counter(
            "pilot_xds_pushes", "xDS responses sent, by type.", ["type"], registry=r
        )
        self.push_errors = Counter(
            "pilot_xds_push_errors", "Responses that could not be written.", ["type"], registry=r
        )
        self.rejects = Counter(
            "pilot_total_xds_rejects", "NACKs received, by type.", ["type"], registry=r
        )
        self.stale_requests = Counter(
            "pilot_xds_expired_nonce",
            "Requests with a stale nonce (ignored).",
            ["type"],
            registry=r,
        )
        self.convergence = Histogram(
            "pilot_proxy_convergence_time",
            "Seconds from the start of a push until the proxy ACKed it.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 3, 5, 10, 20, 30),
            registry=r,
        )
        self.debounce = Histogram(
            "pilot_debounce_time",
            "Seconds from the first change of a push until the push started.",
            buckets=(0.01, 0.1, 0.5, 1, 3, 5, 10, 20),
            registry=r,
        )
        self.push_triggers = Counter(
            "pilot_push_triggers", "Pushes started, by reason.", ["type"], registry=r
        )
        self.config_size = Histogram(
            "pilot_xds_config_size_bytes",
            "Bytes per xDS response.",
            ["type"],
            buckets=(1e3, 1e4, 1e5, 1e6, 1e7),
            registry=r,
        )
        self.rate_limited = Counter(
            "pilotfish_xds_connections_rate_limited",
            "New streams that waited for admission (connection storm control).",
            registry=r,
        )
        self.serializations = Counter(
            "pilotfish_xds_resource_serializations",
            "Resources serialized (each is shared by every proxy that receives it).",
            registry=r,
        )
        self.services = Gauge("pilot_services", "Services in the mesh.", registry=r)
        self.config_errors = Gauge(
            "pilotfish_config_file_errors", "Config files currently rejected.", registry=r
        )
        self.stream_errors = Counter(
            "pilotfish_xds_stream_errors",
            "Streams that ended with an error, by class.",
            ["class"],
            registry=r,
        )
        self.csr_count = Counter(
            "citadel_server_csr_count", "Certificate signing requests.", registry=r
        )
        self.cert_issued = Counter(
            "citadel_server_success_cert_issuance_count", "Certificates issued.", registry=r
        )
        self.csr_auth_errors = Counter(
            "citadel_server_authentication_failure_count",
            "Signing requests whose caller could not be authenticated.",
            registry=r,
        )
        self.csr_parse_errors = Counter(
            "citadel_server_csr_parsing_err_count",
            "Signing requests with a CSR the CA refused.",
            registry=r,
        )
        self.csr_sign_errors = Counter(
            "citadel_server_csr_sign_err_count", "CSRs the CA failed to sign.", registry=r
        )
        self.signer_restarts = Counter(
            "pilotfish_ca_signer_restarts",
            "Signing worker processes started again after one exited.",
            registry=r,
        )
        self.root_expiry = Gauge(
            "citadel_server_root_cert_expiry_timestamp",
            "Unix time at which the root certificate expires.",
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
        return generate_latest(self.registry)
