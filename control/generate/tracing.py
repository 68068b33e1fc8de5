"""Envoy tracing from a proxy's effective telemetry (TracingSettings): the HCM `tracing`
block (Zipkin `envoy.tracers.zipkin` or OpenTelemetry `envoy.tracers.opentelemetry` over
gRPC, random sampling, custom tags) and the collector clusters it names.

Propagation is Envoy's own: the Zipkin tracer reads and writes B3 headers (`x-b3-*`), the
OpenTelemetry tracer W3C `traceparent`; a server-side span joins the trace its caller's
headers carry and keeps the caller's sampling decision, so an app that forwards the headers
gets one trace across hops.

A collector (a gRPC access log service's too) is reached through `outbound|PORT||HOST`, as
in Istio: when HOST is a service the proxy already has that cluster for, it is used as is;
otherwise this module adds one (a DNS cluster, which takes an IP literal too; HTTP/2 for the
gRPC ones).
"""

from __future__ import annotations

import functools
from typing import Final

from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.core.v3.grpc_service_pb2 import GrpcService
from envoy.config.trace.v3.http_tracer_pb2 import Tracing as HttpTracer
from envoy.config.trace.v3.opentelemetry_pb2 import OpenTelemetryConfig
from envoy.config.trace.v3.zipkin_pb2 import ZipkinConfig
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)
from envoy.extensions.request_id.uuid.v3.uuid_pb2 import UuidRequestIdConfig
from envoy.type.tracing.v3.custom_tag_pb2 import CustomTag as EnvoyCustomTag
from envoy.type.v3.percent_pb2 import Percent
from google.protobuf.any_pb2 import Any as AnyProto
from google.protobuf.wrappers_pb2 import BoolValue, UInt32Value

from control.generate.context import GenContext
from control.generate.resource_names import CLUSTER_TYPE, outbound_cluster_name
from control.generate.wire import pack
from control.model.meshconfig import GrpcAccessLogProvider, OpenTelemetryProvider, ZipkinProvider
from control.model.proxy import Proxy
from control.model.telemetry import CustomTag, CustomTagKind, TracingSettings
from control.xds.cache import Resource

ZIPKIN_TRACER: Final = "envoy.tracers.zipkin"
OTEL_TRACER: Final = "envoy.tracers.opentelemetry"
CANONICAL_NAME_LABEL: Final = "service.istio.io/canonical-name"
CANONICAL_REVISION_LABEL: Final = "service.istio.io/canonical-revision"

Collector = ZipkinProvider | OpenTelemetryProvider


def collector_cluster(provider: Collector | GrpcAccessLogProvider) -> str:
    return outbound_cluster_name(provider.port, provider.service)


def service_name(proxy: Proxy) -> str:
    """How the proxy names itself in spans: Istio's `<canonical service>.<namespace>`."""
    return f"{_canonical(proxy)}.{proxy.namespace}"


def _canonical(proxy: Proxy) -> str:
    labels = dict(proxy.labels)
    return labels.get(CANONICAL_NAME_LABEL) or labels.get("app") or proxy.pod_name


def istio_tags(proxy: Proxy, mesh_id: str) -> tuple[tuple[str, str], ...]:
    """The literal tags Istio puts on every span of a proxy."""
    labels = dict(proxy.labels)
    revision = labels.get(CANONICAL_REVISION_LABEL) or labels.get("version") or "latest"
    return (
        ("istio.canonical_revision", revision),
        ("istio.canonical_service", _canonical(proxy)),
        ("istio.mesh_id", mesh_id),
        ("istio.namespace", proxy.namespace),
    )


def hcm_tracing(
    settings: TracingSettings, service: str, tags: tuple[tuple[str, str], ...] = ()
) -> HttpConnectionManager.Tracing:
    """The HCM's `tracing`: the tracer, Istio's sampling fields, Istio's literal `tags`
    and the Telemetry's custom tags (which win on the same name)."""
    tracing = HttpConnectionManager.Tracing(
        random_sampling=Percent(value=settings.sampling),
        client_sampling=Percent(value=100.0),
        overall_sampling=Percent(value=100.0),
        provider=_tracer(settings.provider, service),
    )
    custom = {t.tag for t in settings.custom_tags}
    tracing.custom_tags.extend(
        EnvoyCustomTag(tag=k, literal=EnvoyCustomTag.Literal(value=v))
        for k, v in tags
        if k not in custom
    )
    tracing.custom_tags.extend(_custom_tag(t) for t in settings.custom_tags)
    if settings.provider.max_tag_length:
        tracing.max_path_tag_length.CopyFrom(UInt32Value(value=settings.provider.max_tag_length))
    return tracing


def request_id_extension(use_for_sampling: bool) -> AnyProto:
    """Envoy's UUID request id, saying whether the sampling decision rides in it."""
    return pack(
        UuidRequestIdConfig(
            pack_trace_reason=BoolValue(value=True),
            use_request_id_for_trace_sampling=BoolValue(value=use_for_sampling),
        )
    )


def _tracer(provider: Collector, service: str) -> HttpTracer.Http:
    cluster = collector_cluster(provider)
    if isinstance(provider, ZipkinProvider):
        zipkin = ZipkinConfig(
            collector_cluster=cluster,
            collector_endpoint=provider.path,
            collector_endpoint_version=ZipkinConfig.HTTP_JSON,
            trace_id_128bit=not provider.enable_64bit_trace_id,
            # Istio's choice: the server side starts a span of its own (child of the
            # client's) instead of sharing the client's span id.
            shared_span_context=BoolValue(value=False),
            collector_hostname=provider.service,
        )
        return HttpTracer.Http(name=ZIPKIN_TRACER, typed_config=pack(zipkin))
    grpc = GrpcService(
        envoy_grpc=GrpcService.EnvoyGrpc(cluster_name=cluster, authority=provider.service)
    )
    if provider.timeout:
        grpc.timeout.FromNanoseconds(int(provider.timeout * 1e9))
    otel = OpenTelemetryConfig(grpc_service=grpc, service_name=service)
    return HttpTracer.Http(name=OTEL_TRACER, typed_config=pack(otel))


def _custom_tag(tag: CustomTag) -> EnvoyCustomTag:
    if tag.kind is CustomTagKind.LITERAL:
        return EnvoyCustomTag(tag=tag.tag, literal=EnvoyCustomTag.Literal(value=tag.value))
    if tag.kind is CustomTagKind.HEADER:
        return EnvoyCustomTag(
            tag=tag.tag,
            request_header=EnvoyCustomTag.Header(name=tag.value, default_value=tag.default),
        )
    return EnvoyCustomTag(
        tag=tag.tag,
        environment=EnvoyCustomTag.Environment(name=tag.value, default_value=tag.default),
    )


# --- collector clusters ----------------------------------------------------------------------


def collector_clusters(
    ctx: GenContext, proxy: Proxy, existing: frozenset[str]
) -> tuple[Resource, ...]:
    """The clusters the proxy's tracers and gRPC access loggers (access_logs.py) report to
    that it does not have already. gRPC collectors get HTTP/2."""
    telemetry = ctx.index.telemetry(proxy)
    wanted: list[tuple[Collector | GrpcAccessLogProvider, bool]] = []
    for side in (telemetry.client, telemetry.server):
        if side.tracing is not None:
            tracer = side.tracing.provider
            wanted.append((tracer, isinstance(tracer, OpenTelemetryProvider)))
        wanted.extend((s.grpc, True) for s in side.access_logs if s.grpc is not None)
    out: dict[str, Resource] = {}
    for provider, http2 in wanted:
        name = collector_cluster(provider)
        if name in existing or name in out:
            continue
        key = (name, provider.service, provider.port, http2)
        out[name] = ctx.resource(CLUSTER_TYPE, name, key, functools.partial(build_collector, *key))
    return tuple(out.values())


def build_collector(name: str, host: str, port: int, http2: bool) -> Cluster:
    # Imported here: clusters.py asks this module for the collector clusters.
    from control.generate.clusters import build_dns

    return build_dns(name, http2, ((host, port, 0, "", False),))
