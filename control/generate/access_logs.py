"""Envoy access logs from a proxy's effective telemetry (control/model/telemetry.py
AccessLogSink), for HTTP connection managers and TCP proxies, with the status-code filters a
Telemetry `filter.expression` compiles to. Pure functions of hashable inputs.

- Files (`envoy.access_loggers.file`; `/dev/stdout` and `/dev/stderr` through Envoy's stream
  loggers, which write to the inherited descriptors): Istio's default TEXT format and JSON
  labels, or a custom format.
- gRPC services, to the provider's `outbound|PORT||HOST` cluster (tracing.py adds it when the
  proxy has none): `envoyHttpAls` (Envoy's `http_grpc` logger, on HCMs only), `envoyTcpAls`
  (`tcp_grpc`, TCP proxies only) and `envoyOtelAls` (`open_telemetry`, OTLP LogsService, on
  both; the record's body is the provider's `logFormat.text`, else Istio's TEXT format, and
  its attributes the `logFormat.labels`). Log names default to Istio's.
"""

from __future__ import annotations

import json
from typing import Final

from envoy.config.accesslog.v3.accesslog_pb2 import (
    AccessLog,
    AccessLogFilter,
    AndFilter,
    ComparisonFilter,
    LogTypeFilter,
    OrFilter,
    StatusCodeFilter,
)
from envoy.config.core.v3.base_pb2 import DataSource, RuntimeUInt32
from envoy.config.core.v3.config_source_pb2 import ApiVersion
from envoy.config.core.v3.grpc_service_pb2 import GrpcService
from envoy.config.core.v3.substitution_format_string_pb2 import SubstitutionFormatString
from envoy.data.accesslog.v3.accesslog_pb2 import AccessLogType
from envoy.extensions.access_loggers.file.v3.file_pb2 import FileAccessLog
from envoy.extensions.access_loggers.grpc.v3.als_pb2 import (
    CommonGrpcAccessLogConfig,
    HttpGrpcAccessLogConfig,
    TcpGrpcAccessLogConfig,
)
from envoy.extensions.access_loggers.open_telemetry.v3.logs_service_pb2 import (
    OpenTelemetryAccessLogConfig,
)
from envoy.extensions.access_loggers.stream.v3.stream_pb2 import StderrAccessLog, StdoutAccessLog
from google.protobuf.struct_pb2 import Struct
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from control.generate.resource_names import outbound_cluster_name
from control.generate.warn import warn_once
from control.generate.wire import pack
from control.model.meshconfig import (
    HTTP_ALS,
    OTEL_ALS,
    TCP_ALS,
    AccessLogEncoding,
    GrpcAccessLogProvider,
)
from control.model.telemetry import AccessLogSink, CodeFilter

FILE_LOGGER: Final = "envoy.access_loggers.file"
STDOUT_LOGGER: Final = "envoy.access_loggers.stdout"
STDERR_LOGGER: Final = "envoy.access_loggers.stderr"
HTTP_GRPC_LOGGER: Final = "envoy.access_loggers.http_grpc"
TCP_GRPC_LOGGER: Final = "envoy.access_loggers.tcp_grpc"
OTEL_LOGGER: Final = "envoy.access_loggers.open_telemetry"
# Istio's log names where a provider gives none.
_LOG_NAMES: Final = {
    HTTP_ALS: "http_envoy_accesslog",
    TCP_ALS: "tcp_envoy_accesslog",
    OTEL_ALS: "otel_envoy_accesslog",
}
STDOUT: Final = "/dev/stdout"
STDERR: Final = "/dev/stderr"

# Istio's default TEXT format (pilot/pkg/model/telemetry_logging.go EnvoyTextLogFormat).
ISTIO_TEXT_FORMAT: Final = (
    '[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" '
    "%RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% "
    '"%UPSTREAM_TRANSPORT_FAILURE_REASON%" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% '
    '%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" '
    '"%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%" %UPSTREAM_CLUSTER_RAW% '
    "%UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% "
    "%REQUESTED_SERVER_NAME% %ROUTE_NAME%\n"
)

# Istio's default JSON labels (EnvoyJSONLogFormatIstio).
ISTIO_JSON_LABELS: Final[tuple[tuple[str, str], ...]] = (
    ("authority", "%REQ(:AUTHORITY)%"),
    ("bytes_received", "%BYTES_RECEIVED%"),
    ("bytes_sent", "%BYTES_SENT%"),
    ("connection_termination_details", "%CONNECTION_TERMINATION_DETAILS%"),
    ("downstream_local_address", "%DOWNSTREAM_LOCAL_ADDRESS%"),
    ("downstream_remote_address", "%DOWNSTREAM_REMOTE_ADDRESS%"),
    ("duration", "%DURATION%"),
    ("method", "%REQ(:METHOD)%"),
    ("path", "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%"),
    ("protocol", "%PROTOCOL%"),
    ("request_id", "%REQ(X-REQUEST-ID)%"),
    ("requested_server_name", "%REQUESTED_SERVER_NAME%"),
    ("response_code", "%RESPONSE_CODE%"),
    ("response_code_details", "%RESPONSE_CODE_DETAILS%"),
    ("response_flags", "%RESPONSE_FLAGS%"),
    ("route_name", "%ROUTE_NAME%"),
    ("start_time", "%START_TIME%"),
    ("upstream_cluster", "%UPSTREAM_CLUSTER_RAW%"),
    ("upstream_host", "%UPSTREAM_HOST%"),
    ("upstream_local_address", "%UPSTREAM_LOCAL_ADDRESS%"),
    ("upstream_service_time", "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%"),
    ("upstream_transport_failure_reason", "%UPSTREAM_TRANSPORT_FAILURE_REASON%"),
    ("user_agent", "%REQ(USER-AGENT)%"),
    ("x_forwarded_for", "%REQ(X-FORWARDED-FOR)%"),
)

# Envoy's comparison filter reads its value through the runtime; the key is required.
_RUNTIME_KEY: Final = "access_log.status_code_filter"


def access_logs(sinks: tuple[AccessLogSink, ...], *, http: bool = True) -> list[AccessLog]:
    """The `access_log` entries for an HCM (`http`) or a TCP proxy."""
    return [_access_log(s) for s in sinks if _serves(s, http)]


def _serves(sink: AccessLogSink, http: bool) -> bool:
    if sink.grpc is None or sink.grpc.kind == OTEL_ALS:
        return True
    return (sink.grpc.kind == HTTP_ALS) == http


def _access_log(sink: AccessLogSink) -> AccessLog:
    if sink.grpc is not None:
        log = _grpc_log(sink.grpc)
    else:
        log = _file_log(sink)
    # One line per request or connection, as Istio's logs: the standard-metrics logger on
    # the same TCP proxy asks Envoy for entries on upstream connect and periodically
    # (generate/telemetry_metrics.py), and those would otherwise reach this log too.
    final = AccessLogFilter(log_type_filter=LogTypeFilter(types=_INTERIM, exclude=True))
    if sink.filter is not None:
        final = AccessLogFilter(and_filter=AndFilter(filters=[final, code_filter(sink.filter)]))
    log.filter.CopyFrom(final)
    return log


def _file_log(sink: AccessLogSink) -> AccessLog:
    fmt = log_format(sink)
    if sink.path == STDOUT:
        # Envoy's stream logger writes to the fd it inherited. Opening /dev/stdout, as the
        # file logger would, fails for Envoy running as UID 1337 (mode REDIRECT) when the
        # agent's stdout belongs to another user (a root-owned log file or pipe).
        log = AccessLog(name=STDOUT_LOGGER, typed_config=pack(StdoutAccessLog(log_format=fmt)))
    elif sink.path == STDERR:
        log = AccessLog(name=STDERR_LOGGER, typed_config=pack(StderrAccessLog(log_format=fmt)))
    else:
        log = AccessLog(
            name=FILE_LOGGER, typed_config=pack(FileAccessLog(path=sink.path, log_format=fmt))
        )
    return log


def _grpc_log(provider: GrpcAccessLogProvider) -> AccessLog:
    name = provider.log_name or _LOG_NAMES[provider.kind]
    service = GrpcService(
        envoy_grpc=GrpcService.EnvoyGrpc(
            # tracing.collector_cluster's name: the cluster CDS adds for collectors.
            cluster_name=outbound_cluster_name(provider.port, provider.service),
            authority=provider.service,
        )
    )
    if provider.kind == OTEL_ALS:
        return AccessLog(name=OTEL_LOGGER, typed_config=pack(_otel_config(provider, name, service)))
    common = CommonGrpcAccessLogConfig(
        log_name=name,
        grpc_service=service,
        transport_api_version=ApiVersion.V3,
        filter_state_objects_to_log=list(provider.filter_state_objects),
    )
    if provider.kind == HTTP_ALS:
        http = HttpGrpcAccessLogConfig(
            common_config=common,
            additional_request_headers_to_log=list(provider.request_headers),
            additional_response_headers_to_log=list(provider.response_headers),
            additional_response_trailers_to_log=list(provider.response_trailers),
        )
        return AccessLog(name=HTTP_GRPC_LOGGER, typed_config=pack(http))
    tcp = TcpGrpcAccessLogConfig(common_config=common)
    return AccessLog(name=TCP_GRPC_LOGGER, typed_config=pack(tcp))


# OpenTelemetryAccessLogConfig fields newer than the bundled Python protos (Envoy deprecated
# `common_config` for them and warns on it): written by number, kept by the message as unknown
# fields and serialized with it.
_OTEL_GRPC_SERVICE: Final = 9
_OTEL_LOG_NAME: Final = 10
_OTEL_FILTER_STATE_OBJECTS: Final = 13


def _otel_config(
    provider: GrpcAccessLogProvider, name: str, service: GrpcService
) -> OpenTelemetryAccessLogConfig:
    known = OpenTelemetryAccessLogConfig(
        body=AnyValue(string_value=provider.text or ISTIO_TEXT_FORMAT.removesuffix("\n"))
    )
    if provider.labels:
        known.attributes.values.extend(
            KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in provider.labels
        )
    extra = _length_delimited(_OTEL_GRPC_SERVICE, service.SerializeToString(deterministic=True))
    extra += _length_delimited(_OTEL_LOG_NAME, name.encode())
    for state in provider.filter_state_objects:
        extra += _length_delimited(_OTEL_FILTER_STATE_OBJECTS, state.encode())
    return OpenTelemetryAccessLogConfig.FromString(
        known.SerializeToString(deterministic=True) + extra
    )


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


# Entries Envoy writes before a request or connection ends.
_INTERIM: Final = (
    AccessLogType.TcpUpstreamConnected,
    AccessLogType.TcpPeriodic,
    AccessLogType.DownstreamStart,
    AccessLogType.DownstreamPeriodic,
    AccessLogType.UpstreamPoolReady,
    AccessLogType.UpstreamPeriodic,
)


def log_format(sink: AccessLogSink) -> SubstitutionFormatString:
    if sink.encoding is AccessLogEncoding.JSON:
        labels = _json_labels(sink)
        body = Struct()
        body.update(dict(labels))
        return SubstitutionFormatString(json_format=body)
    text = sink.text_format or ISTIO_TEXT_FORMAT
    if not text.endswith("\n"):
        text += "\n"  # as Istio: one line per entry
    return SubstitutionFormatString(text_format_source=DataSource(inline_string=text))


def _json_labels(sink: AccessLogSink) -> tuple[tuple[str, str], ...]:
    if sink.json_labels is not None:
        return sink.json_labels
    if not sink.text_format:
        return ISTIO_JSON_LABELS
    # MeshConfig accessLogFormat with accessLogEncoding JSON is a JSON object of labels; Istio
    # falls back to its default labels when it is not one, and so do we (said once).
    try:
        parsed = json.loads(sink.text_format)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and all(isinstance(v, str) for v in parsed.values()):
        return tuple(sorted((str(k), v) for k, v in parsed.items()))
    warn_once(
        ("access-log-json-format", sink.text_format),
        "mesh config accessLogFormat is not a JSON object of strings; Istio's default JSON "
        "labels are used",
    )
    return ISTIO_JSON_LABELS


def code_filter(f: CodeFilter) -> AccessLogFilter:
    """Envoy's status-code filters for a compiled `response.code` expression."""
    terms = [_term(op, value) for op, value in f.terms]
    if len(terms) == 1:
        return terms[0]
    if f.all_of:
        return AccessLogFilter(and_filter=AndFilter(filters=terms))
    return AccessLogFilter(or_filter=OrFilter(filters=terms))


_OPS: Final = {
    "==": ComparisonFilter.EQ,
    "!=": ComparisonFilter.NE,
    ">=": ComparisonFilter.GE,
    "<=": ComparisonFilter.LE,
}


def _status(op: ComparisonFilter.Op.ValueType, value: int) -> AccessLogFilter:
    comparison = ComparisonFilter(
        op=op, value=RuntimeUInt32(default_value=value, runtime_key=_RUNTIME_KEY)
    )
    return AccessLogFilter(status_code_filter=StatusCodeFilter(comparison=comparison))


def _term(op: str, value: int) -> AccessLogFilter:
    if op == ">":
        return _status(ComparisonFilter.GE, value + 1)
    if op == "<":
        if value == 0:  # no code is below zero: a filter nothing passes
            return AccessLogFilter(
                and_filter=AndFilter(
                    filters=[_status(ComparisonFilter.LE, 0), _status(ComparisonFilter.GE, 1)]
                )
            )
        return _status(ComparisonFilter.LE, value - 1)
    return _status(_OPS[op], value)
