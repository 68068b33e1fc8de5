"""LDS and RDS for proxyless gRPC clients and servers (see grpc_targets for the whole chain).

A client gets one api_listener (an HttpConnectionManager on RDS, nothing bound) and one route
configuration per name it may dial, each leading to that name's cluster. A gRPC xDS server
(gRFC A36) gets one listener per inbound port and listening address, holding a non-forwarding
route, mTLS or plaintext as PeerAuthentication says, and the workload's AuthorizationPolicies
as RBAC HTTP filters (gRFC A41) built by authz_rbac, the sidecars' translation.
"""

from __future__ import annotations

import functools
from typing import Final

from envoy.config.listener.v3.api_listener_pb2 import ApiListener
from envoy.config.listener.v3.listener_components_pb2 import FilterChain
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.rbac.v3.rbac_pb2 import RBAC
from envoy.config.route.v3.route_components_pb2 import (
    NonForwardingAction,
    RouteAction,
)
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
    HttpFilter,
    Rds,
)

from control.generate.addresses import socket_address
from control.generate.authz_rbac import http_filters as rbac_http_filters
from control.generate.context import GenContext
from control.generate.filters import catch_all_routes, hcm_filter, router_filter
from control.generate.grpc_targets import (
    VARIANT,
    targets,
)
from control.generate.mesh_tls import grpc_downstream_socket
from control.generate.plans import service_inbound_ports
from control.generate.resource_names import LISTENER_TYPE, ROUTE_TYPE
from control.generate.warn import warn_once
from control.generate.wire import ads_config_source, pack
from control.model.proxy import Proxy
from control.model.types import (
    TLS_MODE_LABEL,
    AuthorizationPolicy,
    MtlsMode,
    proxyless_tls,
)
from control.xds.cache import Resource, ResourceSet

# Istio's listener name template for gRPC xDS servers (its agent writes it into the
# bootstrap as `server_listener_resource_name_template`; `%s` is the listening IP:port).
SERVER_LISTENER_PREFIX: Final = "xds.istio.io/grpc/lds/inbound/"
# Where a server may listen besides its pod IPs: every address (IPv4, IPv6).
WILDCARD_HOSTS: Final = ("0.0.0.0", "::")
# Suffixes of the RBAC filter names (DENY, ALLOW), see build_server_listener.
_RBAC_ACTIONS: Final = {RBAC.DENY: "deny", RBAC.ALLOW: "allow"}


# --- generators ------------------------------------------------------------------------------


def generate_listeners(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    found = targets(ctx, proxy)
    outbound = ctx.memo(
        ("grpc-lds-outbound", id(found)),
        lambda: tuple(_listener(ctx, name) for name, _ in found),
    )
    inbound = server_listeners(ctx, proxy)
    if not inbound:
        return ctx.memo(("grpc-lds-set", id(found)), lambda: ResourceSet(list(outbound)))
    return ResourceSet([*outbound, *inbound])


def generate_routes(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    found = targets(ctx, proxy)
    return ctx.memo(
        ("grpc-rds-set", id(found)),
        lambda: ResourceSet([_route(ctx, name, cluster.name) for name, cluster in found]),
    )


# --- xDS servers -----------------------------------------------------------------------------


def server_listener_name(host: str, port: int) -> str:
    """The listener a gRPC xDS server listening on host:port asks for (IPv6 in brackets, as
    gRPC joins host and port)."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return SERVER_LISTENER_PREFIX + address


def server_ports(ctx: GenContext, proxy: Proxy) -> tuple[int, ...]:
    """The ports the proxy's workload serves: target ports of the services selecting it."""
    return ctx.memo(
        ("grpc-server-ports", proxy.namespace, proxy.labels),
        lambda: tuple(
            p.number for p in service_inbound_ports(ctx.index.services_selecting(proxy), proxy.ip)
        ),
    )


def server_listeners(ctx: GenContext, proxy: Proxy) -> tuple[Resource, ...]:
    """A listener per inbound port and address the server may listen on. Without the
    certificate provider a STRICT port cannot be served and gets no listener: the gRPC server
    then never starts serving it (fail closed); other ports are plaintext."""
    ports = server_ports(ctx, proxy)
    if not ports:
        return ()
    peer = ctx.index.peer_policy(proxy.namespace, proxy.labels)
    policies = ctx.index.authorization_policies(proxy.namespace, proxy.labels)
    labelled = dict(proxy.labels).get(TLS_MODE_LABEL) == "istio"
    hosts = (*proxy.ips, *WILDCARD_HOSTS)
    out: list[Resource] = []
    for port in ports:
        mode = peer.mode_for(port)
        tls = proxyless_tls(mode, labelled)
        if tls and not proxy.cert_provider:
            if mode is MtlsMode.STRICT:
                warn_once(
                    ("grpc-strict-without-provider", proxy.id, port),
                    "proxy %s: inbound port %d is STRICT mTLS but the gRPC bootstrap has no "
                    "`default` certificate provider (node metadata CERTIFICATE_PROVIDER); the "
                    "port is not served",
                    proxy.id,
                    port,
                )
                continue
            tls = False
        for host in hosts:
            name = server_listener_name(host, port)
            key = (host, port, tls, policies)
            out.append(
                ctx.memo(
                    ("grpc-lds-in", name, tls, policies),
                    functools.partial(
                        ctx.resource,
                        LISTENER_TYPE,
                        name,
                        key,
                        functools.partial(build_server_listener, name, *key),
                        variant=VARIANT,
                    ),
                )
            )
    return tuple(out)


def _listener(ctx: GenContext, name: str) -> Resource:
    # The listener says nothing but its own name (twice), so the name is the whole key.
    return ctx.memo(
        ("grpc-lds", name),
        lambda: ctx.resource(
            LISTENER_TYPE, name, (), functools.partial(build_listener, name), variant=VARIANT
        ),
    )


def _route(ctx: GenContext, name: str, cluster: str) -> Resource:
    # `svc:port` leads to a different cluster in each namespace: one slot per cluster, so
    # clients of several namespaces do not evict each other's bytes.
    return ctx.memo(
        ("grpc-rds", name, cluster),
        lambda: ctx.resource(
            ROUTE_TYPE,
            name,
            cluster,
            functools.partial(build_route, name, cluster),
            variant=(VARIANT, cluster),
        ),
    )


# --- pure builders: the output depends on the arguments only ---------------------------------


def build_listener(name: str) -> Listener:
    hcm = HttpConnectionManager(
        rds=Rds(config_source=ads_config_source(), route_config_name=name),
        # gRPC runs the filters in order and requires the router, a terminal filter, last.
        http_filters=[router_filter()],
    )
    return Listener(name=name, api_listener=ApiListener(api_listener=pack(hcm)))


def build_server_listener(
    name: str,
    host: str,
    port: int,
    mtls: bool,
    policies: tuple[AuthorizationPolicy, ...] = (),
) -> Listener:
    """What gRPC's xDS server accepts (A36, A29): the address it listens on (it refuses a
    listener for another), exactly one filter per chain (the HttpConnectionManager, with the
    router last), a route whose action is non-forwarding (any other fails the calls), no
    `use_original_dst`, and for mTLS a DownstreamTlsContext naming certificate providers.
    Nothing goes into `filter_chain_match`: gRPC never matches a chain on SNI, ALPN or
    transport protocol."""
    hcm = HttpConnectionManager(
        route_config=catch_all_routes("inbound", "inbound", NonForwardingAction()),
        http_filters=[
            # gRPC runs them in order; the router, terminal, must come last. Unlike Envoy,
            # gRPC refuses a listener whose HTTP filters share a name: one per action.
            *(
                HttpFilter(name=f"{n}.{_RBAC_ACTIONS[cfg.rules.action]}", typed_config=pack(cfg))
                for n, cfg in rbac_http_filters(policies)
            ),
            router_filter(),
        ],
    )
    chain = FilterChain(
        name="inbound-mtls" if mtls else "inbound-plaintext",
        filters=[hcm_filter(hcm)],
    )
    if mtls:
        chain.transport_socket.CopyFrom(grpc_downstream_socket())
    return Listener(name=name, address=socket_address(host, port), filter_chains=[chain])


def build_route(name: str, cluster: str) -> RouteConfiguration:
    # The route configuration belongs to one listener name, hence one service: a single
    # catch-all virtual host also matches when the channel overrides its authority.
    return catch_all_routes(name, name, RouteAction(cluster=cluster))
