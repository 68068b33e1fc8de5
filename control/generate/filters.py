"""The Envoy filters that every kind of listener here is assembled from (sidecar listeners in
modes NONE and REDIRECT, proxyless gRPC listeners): their names, the HttpConnectionManager of
a sidecar with its defaults, the router that ends every HTTP filter chain, the route table of
a listener with one destination, and the plain TCP proxy. Each listener module adds what only
it decides (RBAC, TLS, routes by host, fault injection). `edit_proxies` changes the HTTP and
TCP proxies of a built listener.
"""

from __future__ import annotations

from collections.abc import Callable

from envoy.config.listener.v3.listener_components_pb2 import Filter, FilterChain
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.route.v3.route_components_pb2 import (
    NonForwardingAction,
    Route,
    RouteAction,
    RouteMatch,
    VirtualHost,
)
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from envoy.extensions.filters.http.router.v3.router_pb2 import Router
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
    HttpFilter,
)
from envoy.extensions.filters.network.tcp_proxy.v3.tcp_proxy_pb2 import TcpProxy
from google.protobuf.wrappers_pb2 import BoolValue, UInt32Value

from control.generate.wire import pack
from control.model.traffic import MAX_DIRECT_RESPONSE_BODY

HCM_FILTER = "envoy.filters.network.http_connection_manager"
TCP_PROXY_FILTER = "envoy.filters.network.tcp_proxy"
ROUTER_FILTER = "envoy.filters.http.router"
TLS_INSPECTOR_FILTER = "envoy.filters.listener.tls_inspector"


def router_filter() -> HttpFilter:
    # Envoy and gRPC both require the router, a terminal filter, last: filters after it never
    # run (gRPC refuses the listener).
    return HttpFilter(name=ROUTER_FILTER, typed_config=pack(Router()))


def hcm_filter(hcm: HttpConnectionManager) -> Filter:
    return Filter(name=HCM_FILTER, typed_config=pack(hcm))


def sidecar_hcm(stat_prefix: str) -> HttpConnectionManager:
    """A sidecar's HttpConnectionManager before its routes: an HTTP filter chain of the router
    alone, to which callers add filters in front of it."""
    return HttpConnectionManager(
        stat_prefix=stat_prefix,
        codec_type=HttpConnectionManager.AUTO,
        # In mode NONE the peer is the local app (outbound) or another sidecar (inbound);
        # neither is the edge, so trust no client address and append none, as Istio does.
        use_remote_address=BoolValue(value=False),
        normalize_path=BoolValue(value=True),
        upgrade_configs=[HttpConnectionManager.UpgradeConfig(upgrade_type="websocket")],
        http_filters=[router_filter()],
    )


def catch_all_routes(
    name: str, vhost: str, action: RouteAction | NonForwardingAction
) -> RouteConfiguration:
    """Routes for a listener that has one destination: one virtual host for every authority,
    with one route, `default`, for every path."""
    match = RouteMatch(prefix="/")
    if isinstance(action, RouteAction):
        route = Route(name="default", match=match, route=action)
    else:
        route = Route(name="default", match=match, non_forwarding_action=action)
    return RouteConfiguration(
        name=name,
        virtual_hosts=[VirtualHost(name=vhost, domains=["*"], routes=[route])],
        max_direct_response_body_size_bytes=direct_body_limit(),
    )


def direct_body_limit() -> UInt32Value:
    """`max_direct_response_body_size_bytes` for every RouteConfiguration: the limit bodies
    are checked against at load (Istio's), not Envoy's smaller default."""
    return UInt32Value(value=MAX_DIRECT_RESPONSE_BODY)


def tcp_proxy(cluster: str) -> Filter:
    return Filter(
        name=TCP_PROXY_FILTER, typed_config=pack(TcpProxy(stat_prefix=cluster, cluster=cluster))
    )


def edit_proxies(
    listener: Listener,
    hcm: Callable[[HttpConnectionManager], object] | None = None,
    tcp: Callable[[TcpProxy], object] | None = None,
) -> None:
    """Apply `hcm` to every HttpConnectionManager and `tcp` to every TCP proxy of `listener`
    (None: leave those as they are), in each filter chain and the default one, in place:
    each config is unpacked, edited and packed again. For what is added to listeners after
    they are built (telemetry), whatever the listener module that built them."""
    chains: list[FilterChain] = list(listener.filter_chains)
    if listener.HasField("default_filter_chain"):
        chains.append(listener.default_filter_chain)
    for chain in chains:
        for f in chain.filters:
            if f.name == HCM_FILTER and hcm is not None:
                manager = HttpConnectionManager()
                f.typed_config.Unpack(manager)
                hcm(manager)
                f.typed_config.CopyFrom(pack(manager))
            elif f.name == TCP_PROXY_FILTER and tcp is not None:
                proxy = TcpProxy()
                f.typed_config.Unpack(proxy)
                tcp(proxy)
                f.typed_config.CopyFrom(pack(proxy))
