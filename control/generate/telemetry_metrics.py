"""Istio's standard metrics for generated listeners: what each HTTP connection manager and TCP
proxy of a sidecar (or router) adds so that its agent can count `istio_requests_total` and
the rest from Envoy's gRPC access log (protos/telemetry.py has the contract and the why).

- On an HCM, Envoy's file logger writing one record per request (`record_format`) to the
  FIFO the agent announced in node metadata (an agent that announced none gets the
  `http_grpc` logger to its `ALS_CLUSTER`, as before); on a TCP proxy a `tcp_grpc` logger to
  `ALS_CLUSTER`, flushed periodically so long TCP connections move the byte counters. Both
  carry this proxy's workload as literal tags: what a workload is comes from the control
  plane's registry (the WorkloadGroup a registered workload was made from) or the proxy's own
  node, never from a peer.
- The Telemetry API's metrics settings: without a prometheus provider the proxy gets no
  loggers, and a side whose overrides disable every metric of a family (HTTP or TCP) none for
  that family; the rest of the overrides travel as one more literal tag (`TAG_OVERRIDES`,
  applied by the agent: agent/telemetry/overrides.py).
- No peer metadata is exchanged: each side's agent names the other workload from the control
  plane's peer table (peers.py) by the peer's address and certificate, so no request or
  response header is added, read or stripped, and no filter runs per request for it. (The
  client side of the ALS path is the exception: `_client_filters`.)

`instrument_listener` is the one entry point: listener builders (sidecar modes NONE and
REDIRECT, gateways) hand it a finished listener and the proxy's `WorkloadTelemetry`.
"""

from __future__ import annotations

from dataclasses import dataclass

from envoy.config.accesslog.v3.accesslog_pb2 import AccessLog
from envoy.config.common.mutation_rules.v3.mutation_rules_pb2 import HeaderMutation as Mutation
from envoy.config.core.v3.base_pb2 import (
    DataSource,
    HeaderValue,
    HeaderValueOption,
    TrafficDirection,
)
from envoy.config.core.v3.config_source_pb2 import ApiVersion
from envoy.config.core.v3.grpc_service_pb2 import GrpcService
from envoy.config.core.v3.substitution_format_string_pb2 import SubstitutionFormatString
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.extensions.access_loggers.file.v3.file_pb2 import FileAccessLog
from envoy.extensions.access_loggers.grpc.v3.als_pb2 import (
    CommonGrpcAccessLogConfig,
    HttpGrpcAccessLogConfig,
    TcpGrpcAccessLogConfig,
)
from envoy.extensions.filters.http.header_mutation.v3.header_mutation_pb2 import (
    HeaderMutation,
    Mutations,
)
from envoy.extensions.filters.http.header_to_metadata.v3.header_to_metadata_pb2 import (
    Config as HeaderToMetadata,
)
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
    HttpFilter,
)
from envoy.extensions.filters.network.tcp_proxy.v3.tcp_proxy_pb2 import TcpProxy
from envoy.type.tracing.v3.custom_tag_pb2 import CustomTag
from google.protobuf.duration_pb2 import Duration
from google.protobuf.wrappers_pb2 import UInt32Value

from control.generate.access_logs import FILE_LOGGER, HTTP_GRPC_LOGGER, TCP_GRPC_LOGGER
from control.generate.context import GenContext
from control.generate.filters import edit_proxies
from control.generate.wire import pack
from control.model.proxy import Proxy
from control.model.telemetry import NO_METRIC_OVERRIDES, SideMetrics, WorkloadMode
from control.model.types import Workload, spiffe_id
from protos import telemetry as t

HEADER_TO_METADATA_FILTER = "envoy.filters.http.header_to_metadata"
HEADER_MUTATION_FILTER = "envoy.filters.http.header_mutation"
# Envoy batches entries for up to this long (it bounds how stale a scrape can be), or until
# this many bytes. Large batches: while a worker's stream to the agent is still connecting,
# Envoy drops every batch after the first, so the first should hold a burst.
LOG_FLUSH = Duration(seconds=1)
LOG_BUFFER = UInt32Value(value=1024 * 1024)
# How often a long TCP connection reports its bytes so far (Istio's TCP metrics report
# every 5 s too).
TCP_FLUSH = Duration(seconds=5)
UNKNOWN = "unknown"
# Which metrics logger an HCM side gets: records on the agent's FIFO, ALS entries (an agent
# that announced no FIFO), or none (no metrics exported for that side).
_RECORDS, _ALS, _NONE = "records", "als", "none"


@dataclass(frozen=True, slots=True)
class WorkloadTelemetry:
    """Who a proxy is, for its metrics: the literal tags of its loggers."""

    workload: str
    namespace: str
    app: str
    version: str
    principal: str
    cluster_domain: str
    # Telemetry metrics: whether a prometheus provider is in force, and each side's overrides.
    reported: bool = True
    client: SideMetrics = NO_METRIC_OVERRIDES
    server: SideMetrics = NO_METRIC_OVERRIDES
    # The agent's metrics FIFO (Proxy.metrics_log); "": HTTP entries go to the ALS too.
    log_path: str = ""

    def side(self, reporter: str) -> SideMetrics:
        return self.server if reporter == t.REPORTER_DESTINATION else self.client

    def tags(self, reporter: str) -> list[CustomTag]:
        return [
            CustomTag(tag=k, literal=CustomTag.Literal(value=v))
            for k, v in self.tag_values(reporter).items()
        ]

    def tag_values(self, reporter: str) -> dict[str, str]:
        values = {
            t.TAG_REPORTER: reporter,
            t.TAG_WORKLOAD: self.workload,
            t.TAG_NAMESPACE: self.namespace,
            t.TAG_APP: self.app,
            t.TAG_VERSION: self.version,
            t.TAG_PRINCIPAL: self.principal,
            t.TAG_CLUSTER_DOMAIN: self.cluster_domain,
        }
        side = self.side(reporter)
        overrides = t.encode_overrides(side.disabled, dict(side.removed))
        if overrides:
            values[t.TAG_OVERRIDES] = overrides
        return values


def workload_telemetry(ctx: GenContext, proxy: Proxy) -> WorkloadTelemetry | None:
    """This proxy's metrics identity; None when it gets no metrics config (its bootstrap has
    no ALS cluster, or it is proxyless gRPC)."""
    if not proxy.als or proxy.is_grpc:
        return None
    registered = ctx.memo(("telemetry-registered",), lambda: _registered(ctx))
    workload = registered.get((proxy.ip, proxy.namespace))
    if workload is not None:
        name, labels, account = registered_identity(workload)
    else:
        # Not registered (yet: a member's first config is generated before its registration
        # reaches the index, with the next push). A proxy that asks to join a WorkloadGroup
        # is named after that group from its first config, as Istio names a VM's workload
        # (its node metadata), so its metrics do not start under the pod's name and move.
        name = proxy.workload_group or proxy.pod_name
        labels, account = dict(proxy.labels), proxy.service_account
    suffix = f"{proxy.namespace}.svc."
    domain = proxy.dns_domain.removeprefix(suffix) if proxy.dns_domain.startswith(suffix) else ""
    metrics = ctx.index.telemetry(proxy).metrics
    return WorkloadTelemetry(
        workload=name or UNKNOWN,
        namespace=proxy.namespace,
        app=app_of(labels),
        version=version_of(labels),
        principal=spiffe_id(ctx.index.trust_domain, proxy.namespace, account),
        cluster_domain=domain or "cluster.local",
        reported=metrics.prometheus,
        client=metrics.side(WorkloadMode.CLIENT) if metrics.prometheus else NO_METRIC_OVERRIDES,
        server=metrics.side(WorkloadMode.SERVER) if metrics.prometheus else NO_METRIC_OVERRIDES,
        log_path=proxy.metrics_log,
    )


def registered_identity(workload: Workload) -> tuple[str, dict[str, str], str]:
    """A registered workload's name, labels and service account in the standard metrics. A
    WorkloadGroup member is that group's workload (Istio names a VM's workload after its
    group); its labels are the group's, not what the proxy announced."""
    group = workload.source.kind == "WorkloadGroup"
    name = workload.source.name if group else workload.name
    return name, dict(workload.labels), workload.service_account


def app_of(labels: dict[str, str]) -> str:
    return labels.get("app") or labels.get("app.kubernetes.io/name") or UNKNOWN


def version_of(labels: dict[str, str]) -> str:
    return labels.get("version") or labels.get("app.kubernetes.io/version") or UNKNOWN


def _registered(ctx: GenContext) -> dict[tuple[str, str], Workload]:
    return {(w.address, w.namespace): w for w in ctx.index.workloads}


def instrument_listener(listener: Listener, telemetry: WorkloadTelemetry | None) -> Listener:
    """Add metrics reporting to every HCM and TCP proxy of `listener` (in place; returned for
    chaining). Inbound listeners report as `destination`, others as `source`."""
    if telemetry is None:
        return listener
    inbound = listener.traffic_direction == TrafficDirection.INBOUND
    reporter = t.REPORTER_DESTINATION if inbound else t.REPORTER_SOURCE
    edit_proxies(
        listener,
        lambda hcm: _instrument_hcm(hcm, telemetry, reporter),
        lambda proxy: _instrument_tcp(proxy, telemetry, reporter),
    )
    return listener


def _instrument_hcm(
    hcm: HttpConnectionManager, telemetry: WorkloadTelemetry, reporter: str
) -> None:
    logged = telemetry.reported and not telemetry.side(reporter).http_off
    logger = (_RECORDS if telemetry.log_path else _ALS) if logged else _NONE
    if reporter == t.REPORTER_SOURCE:
        # First in the chain: responses are read after every other filter wrote them.
        for i, f in enumerate(_client_filters(logger)):
            hcm.http_filters.insert(i, f)
    if logger == _NONE:
        return
    if logger == _RECORDS:
        record = FileAccessLog(
            path=telemetry.log_path,
            log_format=SubstitutionFormatString(
                text_format_source=DataSource(
                    inline_string=t.record_format(telemetry.tag_values(reporter))
                )
            ),
        )
        hcm.access_log.append(AccessLog(name=FILE_LOGGER, typed_config=pack(record)))
        return
    config = HttpGrpcAccessLogConfig(
        common_config=_common(telemetry, reporter),
        additional_request_headers_to_log=["content-type"],
        additional_response_headers_to_log=["grpc-status"],
        additional_response_trailers_to_log=["grpc-status"],
    )
    hcm.access_log.append(AccessLog(name=HTTP_GRPC_LOGGER, typed_config=pack(config)))


def _instrument_tcp(proxy: TcpProxy, telemetry: WorkloadTelemetry, reporter: str) -> None:
    if not telemetry.reported or telemetry.side(reporter).tcp_off:
        return
    config = TcpGrpcAccessLogConfig(common_config=_common(telemetry, reporter))
    proxy.access_log.append(AccessLog(name=TCP_GRPC_LOGGER, typed_config=pack(config)))
    proxy.access_log_options.CopyFrom(
        TcpProxy.TcpAccessLogOptions(
            access_log_flush_interval=TCP_FLUSH, flush_access_log_on_connected=True
        )
    )


def _common(telemetry: WorkloadTelemetry, reporter: str) -> CommonGrpcAccessLogConfig:
    return CommonGrpcAccessLogConfig(
        log_name=t.LOG_NAME,
        grpc_service=GrpcService(envoy_grpc=GrpcService.EnvoyGrpc(cluster_name=t.ALS_CLUSTER)),
        transport_api_version=ApiVersion.V3,
        buffer_flush_interval=LOG_FLUSH,
        buffer_size_bytes=LOG_BUFFER,
        custom_tags=telemetry.tags(reporter),
    )


def _client_filters(logger: str) -> list[HttpFilter]:
    """Outbound: our metadata is the HCM's early mutation (_instrument_hcm) and nothing is read
    from the response, so no filter; except on the ALS path, which needs the upstream
    certificate's SPIFFE ID that an access log entry lacks: Envoy writes it into a response
    header (removed first: when the upstream presented no certificate the value is empty, and
    a header the server forged must not survive that) for the metadata filter to read and
    strip."""
    if logger != _ALS:
        return []
    write = Mutations(
        response_mutations=[
            _remove(t.UPSTREAM_PEER_HEADER),
            _set(t.UPSTREAM_PEER_HEADER, "%UPSTREAM_PEER_URI_SAN%"),
        ],
    )
    read = HeaderToMetadata(
        response_rules=[_to_metadata(t.UPSTREAM_PEER_HEADER, t.METADATA_UPSTREAM_PRINCIPAL)]
    )
    # Order matters on the way back: responses pass filters last to first, so the mutation
    # (second) writes the header before the metadata filter (first) reads it.
    return [
        HttpFilter(name=HEADER_TO_METADATA_FILTER, typed_config=pack(read)),
        _mutation_filter(write),
    ]


def _mutation_filter(mutations: Mutations) -> HttpFilter:
    return HttpFilter(
        name=HEADER_MUTATION_FILTER, typed_config=pack(HeaderMutation(mutations=mutations))
    )


def _to_metadata(header: str, key: str) -> HeaderToMetadata.Rule:
    return HeaderToMetadata.Rule(
        header=header,
        on_header_present=HeaderToMetadata.KeyValuePair(
            metadata_namespace=t.METADATA_NAMESPACE, key=key, type=HeaderToMetadata.STRING
        ),
        remove=True,
    )


def _set(header: str, value: str) -> Mutation:
    return Mutation(
        append=HeaderValueOption(
            header=HeaderValue(key=header, value=value),
            append_action=HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
        )
    )


def _remove(header: str) -> Mutation:
    return Mutation(remove=header)
