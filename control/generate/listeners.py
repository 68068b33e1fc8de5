"""LDS for interception mode NONE: every listener is bound to a real address, because no
iptables rule will steer traffic to a catch-all port.

- outbound: one listener per service port number among the visible services, at
  `<egress bind or pod IP>:<port>`. HTTP services on the port share an HttpConnectionManager
  whose routes (RDS `"<port>"`) pick the service by Host; otherwise TLS services are told apart
  by SNI and one plain TCP service takes the rest.
- inbound: one listener per Sidecar ingress port, at `<ingress bind or pod IP>:<port>`,
  forwarding to the `inbound|PORT||` cluster.

Listeners are named `<address>_<port>` like Istio's, which with the default bind is
`<pod IP>_<port>`. An inbound and an outbound listener on the same address and port cannot both
bind; the inbound one wins because it is the only way into the app.
"""

from __future__ import annotations

from envoy.config.core.v3.base_pb2 import TrafficDirection
from envoy.config.listener.v3.listener_components_pb2 import (
    Filter,
    FilterChain,
    FilterChainMatch,
    ListenerFilter,
)
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.route.v3.route_components_pb2 import (
    Route,
    RouteAction,
    RouteMatch,
    VirtualHost,
)
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from envoy.extensions.filters.http.router.v3.router_pb2 import Router
from envoy.extensions.filters.listener.tls_inspector.v3.tls_inspector_pb2 import TlsInspector
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
    HttpFilter,
)
from envoy.extensions.filters.network.tcp_proxy.v3.tcp_proxy_pb2 import TcpProxy
from google.protobuf.duration_pb2 import Duration
from google.protobuf.wrappers_pb2 import BoolValue

from control.generate.common import (
    LISTENER_TYPE,
    InboundPort,
    OutboundPort,
    ads_config_source,
    egress_bind,
    inbound_cluster_name,
    inbound_ports,
    listener_name,
    outbound_plan,
    pack,
    sidecar_of,
    socket_address,
    variant_resource,
    warn_once,
)
from control.generate.context import GenContext
from control.model.proxy import Proxy
from control.xds.cache import Resource, ResourceSet

HCM_FILTER = "envoy.filters.network.http_connection_manager"
TCP_PROXY_FILTER = "envoy.filters.network.tcp_proxy"
ROUTER_FILTER = "envoy.filters.http.router"
TLS_INSPECTOR_FILTER = "envoy.filters.listener.tls_inspector"

# A TCP-ish listener's filter chains: (SNI server names, cluster); no names = the default chain.
Chains = tuple[tuple[tuple[str, ...], str], ...]


def generate(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    plan = outbound_plan(ctx, proxy)
    sidecar = sidecar_of(ctx, proxy)
    resources: list[Resource] = []
    taken: set[tuple[str, int]] = set()
    for inbound in inbound_ports(ctx, proxy):
        taken.add((inbound.bind, inbound.number))
        resources.append(_inbound(ctx, inbound))
    for port in plan.ports:
        bind = egress_bind(sidecar, port.number, proxy.ip)
        if (bind, port.number) in taken:
            warn_once(
                ("listener-conflict", proxy.id, bind, port.number),
                "proxy %s: outbound listener %s:%d skipped: a Sidecar ingress listener binds "
                "the same address",
                proxy.id,
                bind,
                port.number,
            )
            continue
        resources.append(_outbound(ctx, port, bind))
    return ResourceSet(resources)


def _outbound(ctx: GenContext, port: OutboundPort, bind: str) -> Resource:
    name = listener_name(bind, port.number)
    if port.http:
        # Everything else an HTTP listener needs comes from RDS, so the address is all it reads.
        http_key = (bind, port.number)
        return variant_resource(
            ctx, LISTENER_TYPE, name, ("http", *http_key), lambda: build_outbound_http(*http_key)
        )
    # The plan lives in the push memo, so id(port) cannot be reused during the push.
    chains = ctx.memo(("lds-chains", id(port)), lambda: tcp_chains(port))
    tcp_key = (bind, port.number, chains)
    return variant_resource(
        ctx, LISTENER_TYPE, name, ("tcp", *tcp_key), lambda: build_outbound_tcp(*tcp_key)
    )


def tcp_chains(port: OutboundPort) -> Chains:
    """TLS services get a chain each, matched on SNI; plain TCP carries nothing to tell
    services apart, so the first by hostname takes the default chain and the others are not
    reachable on this port (as with any two servers that want the same address)."""
    chains: list[tuple[tuple[str, ...], str]] = [
        ((c.service.hostname,), c.name) for c in sorted(port.tls, key=lambda c: c.service.hostname)
    ]
    if port.tcp:
        first = min(port.tcp, key=lambda c: c.service.hostname)
        chains.append(((), first.name))
    return tuple(chains)


def _inbound(ctx: GenContext, port: InboundPort) -> Resource:
    key = (port.bind, port.number, port.protocol.is_http)
    return variant_resource(ctx, LISTENER_TYPE, port.listener, key, lambda: build_inbound(*key))


# --- pure builders ---------------------------------------------------------------------------


def build_outbound_http(bind: str, number: int) -> Listener:
    hcm = _hcm(f"outbound_{bind}_{number}")
    hcm.rds.config_source.CopyFrom(ads_config_source())
    hcm.rds.route_config_name = str(number)
    return Listener(
        name=listener_name(bind, number),
        address=socket_address(bind, number),
        filter_chains=[FilterChain(filters=[Filter(name=HCM_FILTER, typed_config=pack(hcm))])],
        traffic_direction=TrafficDirection.OUTBOUND,
    )


def build_outbound_tcp(bind: str, number: int, chains: Chains) -> Listener:
    listener = Listener(
        name=listener_name(bind, number),
        address=socket_address(bind, number),
        traffic_direction=TrafficDirection.OUTBOUND,
    )
    for server_names, cluster in chains:
        chain = FilterChain(filters=[_tcp_proxy(cluster)])
        if server_names:
            chain.filter_chain_match.CopyFrom(
                FilterChainMatch(server_names=list(server_names), transport_protocol="tls")
            )
        listener.filter_chains.append(chain)
    if any(server_names for server_names, _ in chains):
        listener.listener_filters.append(
            ListenerFilter(name=TLS_INSPECTOR_FILTER, typed_config=pack(TlsInspector()))
        )
    return listener


def build_inbound(bind: str, number: int, http: bool) -> Listener:
    cluster = inbound_cluster_name(number)
    if http:
        hcm = _hcm(f"inbound_{bind}_{number}")
        # Inline: the route is fixed (everything to the app), so an RDS round trip would only
        # delay the listener becoming ready.
        hcm.route_config.CopyFrom(
            RouteConfiguration(
                name=cluster,
                virtual_hosts=[
                    VirtualHost(
                        name=f"inbound|http|{number}",
                        domains=["*"],
                        routes=[
                            Route(
                                name="default",
                                match=RouteMatch(prefix="/"),
                                route=RouteAction(cluster=cluster, timeout=Duration(seconds=0)),
                            )
                        ],
                    )
                ],
                validate_clusters=BoolValue(value=False),
            )
        )
        network_filter = Filter(name=HCM_FILTER, typed_config=pack(hcm))
    else:
        network_filter = _tcp_proxy(cluster)
    return Listener(
        name=listener_name(bind, number),
        address=socket_address(bind, number),
        filter_chains=[FilterChain(filters=[network_filter])],
        traffic_direction=TrafficDirection.INBOUND,
    )


def _hcm(stat_prefix: str) -> HttpConnectionManager:
    return HttpConnectionManager(
        stat_prefix=stat_prefix,
        codec_type=HttpConnectionManager.AUTO,
        # In mode NONE the peer is the local app (outbound) or another sidecar (inbound);
        # neither is the edge, so trust no client address and append none, as Istio does.
        use_remote_address=BoolValue(value=False),
        normalize_path=BoolValue(value=True),
        upgrade_configs=[HttpConnectionManager.UpgradeConfig(upgrade_type="websocket")],
        # The router must be last: filters after it never run.
        http_filters=[HttpFilter(name=ROUTER_FILTER, typed_config=pack(Router()))],
    )


def _tcp_proxy(cluster: str) -> Filter:
    return Filter(
        name=TCP_PROXY_FILTER, typed_config=pack(TcpProxy(stat_prefix=cluster, cluster=cluster))
    )
