"""Telemetry on a built listener: access logs on every HttpConnectionManager and TCP proxy
(inbound, outbound, passthrough chains alike) and the tracer on every HCM, for one side of a
proxy. The listener builders stay pure functions of their specs; a generator passes the
`ListenerTelemetry` of the side (part of the resource's cache key) and wraps the build in
`with_telemetry`. Gateway listeners (CLIENT side, as in Istio) use it the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)
from envoy.extensions.filters.network.tcp_proxy.v3.tcp_proxy_pb2 import TcpProxy

from control.generate.access_logs import access_logs
from control.generate.context import GenContext
from control.generate.filters import edit_proxies
from control.generate.tracing import (
    hcm_tracing,
    istio_tags,
    request_id_extension,
    service_name,
)
from control.model.proxy import Proxy
from control.model.telemetry import SideTelemetry, WorkloadMode


@dataclass(frozen=True, slots=True)
class ListenerTelemetry:
    side: SideTelemetry
    service: str = ""  # how the proxy names itself in spans
    tags: tuple[tuple[str, str], ...] = ()  # Istio's literal span tags for the proxy

    @property
    def empty(self) -> bool:
        return not self.side.access_logs and self.side.tracing is None


NONE = ListenerTelemetry(SideTelemetry())


def listener_telemetry(ctx: GenContext, proxy: Proxy, mode: WorkloadMode) -> ListenerTelemetry:
    side = ctx.index.telemetry(proxy).side(mode)
    if not side.access_logs and side.tracing is None:
        return NONE
    if side.tracing is None:
        return ListenerTelemetry(side)
    # Istio's mesh id defaults to the trust domain.
    tags = istio_tags(proxy, ctx.index.trust_domain)
    return ListenerTelemetry(side, service_name(proxy), tags)


def with_telemetry(listener: Listener, telemetry: ListenerTelemetry) -> Listener:
    """`listener` with the side's access logs and tracer added (in place; returned)."""
    if telemetry.empty:
        return listener
    logs = access_logs(telemetry.side.access_logs)
    tcp_logs = access_logs(telemetry.side.access_logs, http=False)
    tracing = telemetry.side.tracing
    hcm_trace = (
        hcm_tracing(tracing, telemetry.service, telemetry.tags) if tracing is not None else None
    )

    def on_hcm(hcm: HttpConnectionManager) -> None:
        hcm.access_log.extend(logs)
        if hcm_trace is not None:
            hcm.tracing.CopyFrom(hcm_trace)
        if tracing is not None and not tracing.use_request_id:
            hcm.request_id_extension.typed_config.CopyFrom(request_id_extension(False))

    def on_tcp(tcp: TcpProxy) -> None:
        tcp.access_log.extend(tcp_logs)

    edit_proxies(listener, on_hcm, on_tcp if tcp_logs else None)
    return listener
