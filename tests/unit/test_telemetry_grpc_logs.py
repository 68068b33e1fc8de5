"""gRPC access log providers (`envoyHttpAls`, `envoyTcpAls`, `envoyOtelAls`): which logger goes
on which filter, what it carries, and the collector cluster it reports to."""

from __future__ import annotations

from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.core.v3.grpc_service_pb2 import GrpcService
from envoy.extensions.access_loggers.grpc.v3.als_pb2 import (
    HttpGrpcAccessLogConfig,
    TcpGrpcAccessLogConfig,
)
from envoy.extensions.access_loggers.open_telemetry.v3.logs_service_pb2 import (
    OpenTelemetryAccessLogConfig,
)
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)
from envoy.extensions.filters.network.tcp_proxy.v3.tcp_proxy_pb2 import TcpProxy
from google.protobuf import any_pb2
from google.protobuf.unknown_fields import UnknownFieldSet

from control.config.meshconfig import parse_mesh_config
from control.generate import GENERATORS
from control.generate.access_logs import (
    HTTP_GRPC_LOGGER,
    ISTIO_TEXT_FORMAT,
    OTEL_LOGGER,
    TCP_GRPC_LOGGER,
)
from control.generate.context import GenContext
from control.generate.filters import HCM_FILTER, TCP_PROXY_FILTER
from control.generate.resource_names import CLUSTER_TYPE
from control.model.index import MeshIndex
from control.xds.cache import ResourceCache
from tests.support.traffic import mesh_config
from tests.unit.test_telemetry import APP, filters, listeners, proxy, telemetry

MESH = """\
extensionProviders:
- name: otel
  envoyOtelAls:
    service: otel.observability.svc.cluster.local
    port: 4317
    logFormat: {labels: {code: "%RESPONSE_CODE%"}}
- name: als
  envoyHttpAls:
    service: 127.0.0.9
    port: 9001
    logName: mine
    additionalRequestHeadersToLog: [x-user]
    additionalResponseTrailersToLog: [grpc-message]
    filterStateObjectsToLog: [some.state]
- name: tcp
  envoyTcpAls: {service: 127.0.0.9, port: 9001}
defaultProviders: {accessLogging: [otel, als, tcp]}
"""
OTEL_CLUSTER = "outbound|4317||otel.observability.svc.cluster.local"
ALS_CLUSTER = "outbound|9001||127.0.0.9"


def _loggers(config_any: any_pb2.Any, kind: type[HttpConnectionManager | TcpProxy]):  # type: ignore[no-untyped-def]
    message = kind()
    assert config_any.Unpack(message)
    return {log.name: log for log in message.access_log}


def _otel_fields(config: OpenTelemetryAccessLogConfig) -> dict[int, list[bytes]]:
    """The fields Envoy has and the bundled protos do not, by number."""
    out: dict[int, list[bytes]] = {}
    for f in UnknownFieldSet(config):
        out.setdefault(f.field_number, []).append(f.data)
    return out


def test_each_service_on_the_filters_it_serves() -> None:
    ls = listeners(mesh_config(APP), MESH, proxy())
    hcms, tcps = filters(ls, HCM_FILTER), filters(ls, TCP_PROXY_FILTER)
    assert hcms and tcps
    for _, typed in hcms:
        logs = _loggers(typed, HttpConnectionManager)
        assert set(logs) == {OTEL_LOGGER, HTTP_GRPC_LOGGER}
        http = HttpGrpcAccessLogConfig()
        assert logs[HTTP_GRPC_LOGGER].typed_config.Unpack(http)
        common = http.common_config
        assert common.log_name == "mine"
        assert common.grpc_service.envoy_grpc.cluster_name == ALS_CLUSTER
        assert common.grpc_service.envoy_grpc.authority == "127.0.0.9"
        assert list(common.filter_state_objects_to_log) == ["some.state"]
        assert list(http.additional_request_headers_to_log) == ["x-user"]
        assert list(http.additional_response_trailers_to_log) == ["grpc-message"]
        # One entry per request: Envoy's interim entries are filtered out, as for files.
        assert logs[HTTP_GRPC_LOGGER].filter.HasField("log_type_filter")

        otel = OpenTelemetryAccessLogConfig()
        assert logs[OTEL_LOGGER].typed_config.Unpack(otel)
        assert not otel.HasField("common_config")  # deprecated in Envoy
        assert otel.body.string_value == ISTIO_TEXT_FORMAT.removesuffix("\n")
        assert [(a.key, a.value.string_value) for a in otel.attributes.values] == [
            ("code", "%RESPONSE_CODE%")
        ]
        fields = _otel_fields(otel)
        (service_bytes,) = fields[9]
        service = GrpcService.FromString(service_bytes)
        assert service.envoy_grpc.cluster_name == OTEL_CLUSTER
        assert fields[10] == [b"otel_envoy_accesslog"]  # Istio's default log name
    for _, typed in tcps:
        logs = _loggers(typed, TcpProxy)
        assert set(logs) == {OTEL_LOGGER, TCP_GRPC_LOGGER}
        tcp = TcpGrpcAccessLogConfig()
        assert logs[TCP_GRPC_LOGGER].typed_config.Unpack(tcp)
        assert tcp.common_config.log_name == "tcp_envoy_accesslog"


def test_collector_clusters_are_http2_and_only_when_used() -> None:
    p = proxy()
    config = mesh_config(APP)
    idx = MeshIndex(config, [p.as_workload()], mesh=parse_mesh_config(MESH, "m"))
    clusters = GENERATORS[CLUSTER_TYPE](GenContext(idx, ResourceCache()), p)
    for name in (OTEL_CLUSTER, ALS_CLUSTER):
        cluster = Cluster()
        wrapped = any_pb2.Any()
        wrapped.ParseFromString(clusters[name].any_bytes)
        assert wrapped.Unpack(cluster)
        assert cluster.typed_extension_protocol_options, name  # HTTP/2 for gRPC
    # A Telemetry turning the services off for this workload: no loggers, no clusters.
    off = telemetry("off-logs", "default", "accessLogging: [{disabled: true}]", "app: backend")
    config = mesh_config(APP, off)
    idx = MeshIndex(config, [p.as_workload()], mesh=parse_mesh_config(MESH, "m"))
    clusters = GENERATORS[CLUSTER_TYPE](GenContext(idx, ResourceCache()), p)
    assert OTEL_CLUSTER not in clusters and ALS_CLUSTER not in clusters
    for _, typed in filters(listeners(config, MESH, p), HCM_FILTER):
        assert OTEL_LOGGER not in _loggers(typed, HttpConnectionManager)
