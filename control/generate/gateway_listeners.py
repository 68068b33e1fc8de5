"""LDS for a router: one listener per merged gateway address and port (model/gateway_index.py),
named `<address>_<port>` as Istio's, bound at `<router IP>:<port>` in interception mode NONE
and `0.0.0.0:<port>` otherwise (a server's `bind` overrides either); the port is the
targetPort when a Service selecting the router maps the server's port (as Istio).

- HTTP, HTTP2, GRPC: one HttpConnectionManager whose routes are RDS `http.<port>` (every
  server on the port shares it; gateway_routes.py makes its virtual hosts).
- HTTPS and TLS: the TLS inspector and one filter chain per SNI: a terminating server
  (SIMPLE, MUTUAL, ISTIO_MUTUAL) gets its DownstreamTlsContext (gateway_tls.py) and, for
  HTTPS, an HttpConnectionManager with RDS `https.<port>.<name>.<gateway>.<namespace>`, for
  TLS a TCP proxy from the bound VirtualServices' `tcp` routes; a PASSTHROUGH server gets a
  chain per SNI host of its VirtualServices' `tls` routes, proxied without terminating.
- TCP: a TCP proxy from the first bound `tcp` route for the port.

Where nothing is routed, connections go to `BlackHoleCluster` (Envoy needs a filter chain).
The router is the mesh's edge: its connection managers trust no forwarded client address
they did not see and replace any `x-forwarded-client-cert` a client sent.
"""

from __future__ import annotations

from dataclasses import dataclass

from envoy.config.core.v3.base_pb2 import TrafficDirection
from envoy.config.listener.v3.listener_components_pb2 import (
    Filter,
    FilterChain,
    FilterChainMatch,
    ListenerFilter,
)
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.extensions.filters.listener.tls_inspector.v3.tls_inspector_pb2 import TlsInspector
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)
from google.protobuf.wrappers_pb2 import BoolValue

from control.generate.addresses import WILDCARD_BIND, socket_address
from control.generate.context import GenContext, variant_resource
from control.generate.filters import TLS_INSPECTOR_FILTER, hcm_filter, sidecar_hcm
from control.generate.gateway_tls import HTTPS_ALPN, server_socket
from control.generate.listener_telemetry import (
    ListenerTelemetry,
    listener_telemetry,
    with_telemetry,
)
from control.generate.listeners_explicit import weighted_tcp_proxy
from control.generate.plans import destination_cluster
from control.generate.resource_names import BLACKHOLE_CLUSTER, LISTENER_TYPE, listener_name
from control.generate.route_translation import add_route_filters
from control.generate.telemetry_metrics import (
    WorkloadTelemetry,
    instrument_listener,
    workload_telemetry,
)
from control.generate.warn import warn_once
from control.generate.wire import ads_config_source, pack
from control.model.gateway import ServerTls
from control.model.gateway_index import (
    BoundServer,
    GatewayListener,
    PortKind,
    host_intersection,
)
from control.model.index import MeshIndex
from control.model.proxy import Proxy
from control.model.telemetry import WorkloadMode
from control.model.traffic import Destination
from control.model.types import Protocol
from control.xds.cache import Resource, ResourceSet

# (cluster, weight) pairs a TCP proxy splits connections over.
Targets = tuple[tuple[str, int], ...]
_BLACKHOLE: Targets = ((BLACKHOLE_CLUSTER, 0),)


@dataclass(frozen=True, slots=True)
class ChainSpec:
    """One filter chain: the SNI names it matches (none: any), the TLS it terminates (None:
    passthrough or plaintext), and either the RDS name of its connection manager or the
    targets of its TCP proxy."""

    server_names: tuple[str, ...]
    tls: tuple[ServerTls, tuple[str, ...]] | None  # (settings, ALPN)
    route_name: str = ""
    targets: Targets = ()


def default_bind(proxy: Proxy) -> str:
    """Where a router's listeners bind unless a server says `bind` (DESIGN: the pod IP in
    interception mode NONE, every address otherwise)."""
    return proxy.ip if proxy.interception_mode != "REDIRECT" else WILDCARD_BIND


def http_route_name(listener: GatewayListener, bind: str) -> str:
    """`http.<port>`; a listener at another address than the router's default gets a name of
    its own (`http.<port>.<address>`), so servers bound apart are routed apart."""
    base = f"http.{listener.port}"
    return base if listener.bind == bind else f"{base}.{listener.bind}"


def router_listeners(ctx: GenContext, proxy: Proxy) -> tuple[tuple[GatewayListener, ...], str]:
    """The router's merged listeners and its default bind; conflicts are reported once."""
    bind = default_bind(proxy)
    listeners, conflicts = ctx.memo(
        ("gateway-listeners", proxy.labels, proxy.namespace, bind),
        lambda: ctx.index.gateway_listeners(proxy, bind),
    )
    for conflict in conflicts:
        warn_once(("gateway-conflict", conflict.message()), "%s", conflict.message())
    return listeners, bind


def generate(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    listeners, bind = router_listeners(ctx, proxy)
    # A router reports as Istio's gateways do: the client side of every request it forwards
    # (reporter="source", source_workload = the router's workload).
    tel = listener_telemetry(ctx, proxy, WorkloadMode.CLIENT)
    metrics = workload_telemetry(ctx, proxy)
    return ctx.memo(
        ("gateway-lds", proxy.labels, proxy.namespace, bind, tel, metrics),
        lambda: ResourceSet(
            [_resource(ctx, listener, bind, tel, metrics) for listener in listeners]
        ),
    )


def _resource(
    ctx: GenContext,
    listener: GatewayListener,
    bind: str,
    tel: ListenerTelemetry,
    metrics: WorkloadTelemetry | None,
) -> Resource:
    name = listener_name(listener.bind, listener.port)
    if listener.kind is PortKind.HTTP:
        route = http_route_name(listener, bind)
        return variant_resource(
            ctx,
            LISTENER_TYPE,
            name,
            (listener.bind, listener.port, route, tel, metrics),
            lambda: instrument_listener(
                with_telemetry(build_http(listener.bind, listener.port, route), tel), metrics
            ),
        )
    chains = chain_specs(ctx.index, listener)
    inspect = listener.kind is PortKind.TLS
    return variant_resource(
        ctx,
        LISTENER_TYPE,
        name,
        (listener.bind, listener.port, chains, inspect, tel, metrics),
        lambda: instrument_listener(
            with_telemetry(build_chains(listener.bind, listener.port, chains, inspect), tel),
            metrics,
        ),
    )


def chain_specs(index: MeshIndex, listener: GatewayListener) -> tuple[ChainSpec, ...]:
    """The filter chains of a TLS or TCP listener, in server order; an SNI name a chain
    already matches is left out of later ones (Envoy refuses two chains that match alike)."""
    out: list[ChainSpec] = []
    used: set[tuple[str, ...]] = set()
    names_taken: set[str] = set()

    def add(spec: ChainSpec, owner: BoundServer) -> None:
        names = tuple(n for n in spec.server_names if n not in names_taken)
        if spec.server_names and not names:
            warn_once(
                ("gateway-sni-dup", owner.label, spec.server_names),
                "%s: SNI %s is already routed by an earlier filter chain on port %d; left out",
                owner.label,
                ", ".join(spec.server_names),
                listener.port,
            )
            return
        if names in used:
            return
        used.add(names)
        names_taken.update(names)
        out.append(ChainSpec(names, spec.tls, spec.route_name, spec.targets))

    for bound in listener.servers:
        tls = bound.server.tls
        if listener.kind is PortKind.TCP:
            add(ChainSpec((), None, targets=_tcp_targets(index, bound)), bound)
        elif bound.terminates and tls is not None:
            names = _sni_names(tuple(h.partition("/")[2] for h in bound.hosts))
            if bound.server.protocol is Protocol.HTTPS:
                add(ChainSpec(names, (tls, HTTPS_ALPN), route_name=bound.route_name), bound)
            else:
                add(ChainSpec(names, (tls, ()), targets=_tcp_targets(index, bound)), bound)
        else:
            for names, targets in _passthrough(index, bound):
                add(ChainSpec(names, None, targets=targets), bound)
    if not out:
        out.append(ChainSpec((), None, targets=_BLACKHOLE))
    return tuple(out)


def _sni_names(hosts: tuple[str, ...]) -> tuple[str, ...]:
    # `*` matches every name: a chain without server_names.
    return () if "*" in hosts else tuple(dict.fromkeys(h.lower() for h in hosts))


def _targets(index: MeshIndex, destinations: tuple[Destination, ...], port: int) -> Targets:
    return tuple((destination_cluster(index, d, port), d.weight) for d in destinations)


def _tcp_targets(index: MeshIndex, bound: BoundServer) -> Targets:
    port = bound.server.port
    for vs in index.gateway_virtual_services(bound):
        for route in vs.tcp:
            if not route.ports or port in route.ports:
                return _targets(index, route.destinations, port)
    return _BLACKHOLE


def _passthrough(index: MeshIndex, bound: BoundServer) -> list[tuple[tuple[str, ...], Targets]]:
    """SNI chains of a PASSTHROUGH server: each `tls` route of a bound VirtualService for
    this port, for the SNI hosts it shares with the server's hosts."""
    port = bound.server.port
    out: list[tuple[tuple[str, ...], Targets]] = []
    for vs in index.gateway_virtual_services(bound):
        for route in vs.tls:
            if route.ports and port not in route.ports:
                continue
            names: list[str] = []
            for sni in route.sni_hosts:
                for entry in bound.hosts:
                    namespace, _, pattern = entry.partition("/")
                    if namespace not in ("*", vs.namespace):
                        continue
                    both = host_intersection(sni, pattern)
                    if both is not None and both not in names:
                        names.append(both)
            if names:
                out.append((_sni_names(tuple(names)), _targets(index, route.destinations, port)))
    return out


# --- pure builders ---------------------------------------------------------------------------


def gateway_hcm(stat_prefix: str, route_name: str) -> HttpConnectionManager:
    hcm = sidecar_hcm(stat_prefix)
    # The edge: the client's address is the peer's (Istio's gateways), and a client cannot
    # send an XFCC the backend would believe; a client certificate (MUTUAL) is passed on.
    hcm.use_remote_address.CopyFrom(BoolValue(value=True))
    hcm.forward_client_cert_details = HttpConnectionManager.SANITIZE_SET
    hcm.set_current_client_cert_details.uri = True
    add_route_filters(hcm)
    hcm.rds.config_source.CopyFrom(ads_config_source())
    hcm.rds.route_config_name = route_name
    return hcm


def build_http(bind: str, port: int, route_name: str) -> Listener:
    hcm = gateway_hcm(f"gateway_{bind}_{port}", route_name)
    return Listener(
        name=listener_name(bind, port),
        address=socket_address(bind, port),
        filter_chains=[FilterChain(filters=[hcm_filter(hcm)])],
        traffic_direction=TrafficDirection.OUTBOUND,
    )


def _chain_filters(bind: str, port: int, spec: ChainSpec) -> list[Filter]:
    if spec.route_name:
        return [hcm_filter(gateway_hcm(f"gateway_{bind}_{port}", spec.route_name))]
    return [weighted_tcp_proxy(spec.targets, False, port)]


def build_chains(bind: str, port: int, chains: tuple[ChainSpec, ...], inspect: bool) -> Listener:
    listener = Listener(
        name=listener_name(bind, port),
        address=socket_address(bind, port),
        traffic_direction=TrafficDirection.OUTBOUND,
    )
    for spec in chains:
        chain = FilterChain(filters=_chain_filters(bind, port, spec))
        if spec.server_names:
            chain.filter_chain_match.CopyFrom(
                FilterChainMatch(server_names=list(spec.server_names), transport_protocol="tls")
            )
        if spec.tls is not None:
            chain.transport_socket.CopyFrom(server_socket(*spec.tls))
        listener.filter_chains.append(chain)
    if inspect:
        listener.listener_filters.append(
            ListenerFilter(name=TLS_INSPECTOR_FILTER, typed_config=pack(TlsInspector()))
        )
    return listener
