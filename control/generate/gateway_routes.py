"""RDS for a router: `http.<port>` for each plaintext HTTP port (all its servers), and
`https.<port>.<name>.<gateway>.<namespace>` for each terminated HTTPS server, as Istio names
them.

Virtual hosts come from the VirtualServices bound to the servers (model/gateway_index.py):
one per host a VirtualService serves through a server (the intersection of its hosts with the
server's), with domains `host` and `host:port`. Several VirtualServices for one host merge
their routes in (namespace, name) order, as Istio merges them at a gateway; each
VirtualService's HTTP routes translate as for sidecars (route_tables.vs_routes). A request for
a host nothing serves gets Envoy's 404; a server with `httpsRedirect` answers 301 to https.
"""

from __future__ import annotations

from envoy.config.route.v3.route_components_pb2 import VirtualHost
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from google.protobuf.wrappers_pb2 import BoolValue

from control.generate.context import GenContext, variant_resource
from control.generate.gateway_listeners import http_route_name, router_listeners
from control.generate.resource_names import ROUTE_TYPE
from control.generate.route_tables import vs_routes
from control.generate.route_translation import RouteSpec, build_route
from control.model.gateway_index import BoundServer, PortKind, server_hosts_for
from control.model.index import MeshIndex
from control.model.proxy import Proxy
from control.model.types import Protocol
from control.xds.cache import Resource, ResourceSet

# (host, https redirect, routes): everything one virtual host's bytes are made of.
GatewayVhost = tuple[str, bool, tuple[RouteSpec, ...]]


def generate(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    listeners, bind = router_listeners(ctx, proxy)

    def build_all() -> ResourceSet:
        tables: dict[str, list[BoundServer]] = {}
        for listener in listeners:
            if listener.kind is PortKind.HTTP:
                tables.setdefault(http_route_name(listener, bind), []).extend(listener.servers)
            elif listener.kind is PortKind.TLS:
                for bound in listener.servers:
                    if bound.terminates and bound.server.protocol is Protocol.HTTPS:
                        tables.setdefault(bound.route_name, []).append(bound)
        scope = ctx.index.traffic_scope(proxy.namespace)
        return ResourceSet(
            [
                _resource(ctx, name, tuple(servers), proxy.namespace, scope)
                for name, servers in tables.items()
            ]
        )

    return ctx.memo(("gateway-rds", proxy.labels, proxy.namespace, bind), build_all)


def _resource(
    ctx: GenContext,
    name: str,
    servers: tuple[BoundServer, ...],
    namespace: str,
    scope: str,
) -> Resource:
    port = servers[0].server.port
    key = (name, port, vhost_specs(ctx.index, servers, namespace, scope))
    return variant_resource(ctx, ROUTE_TYPE, name, key, lambda: build(*key))


def vhost_specs(
    index: MeshIndex, servers: tuple[BoundServer, ...], namespace: str, scope: str
) -> tuple[GatewayVhost, ...]:
    """Virtual hosts in the order their hosts first appear (servers in precedence order,
    then VirtualServices by namespace/name); a host's routes are every bound
    VirtualService's for it, in that order."""
    hosts: dict[str, tuple[bool, list[RouteSpec], set[tuple[str, str]]]] = {}
    for bound in servers:
        redirect = bound.server.tls is not None and bound.server.tls.https_redirect
        port = bound.server.port
        for vs in index.gateway_virtual_services(bound):
            routes: tuple[RouteSpec, ...] | None = None
            for host in server_hosts_for(bound.hosts, vs):
                entry = hosts.setdefault(host.lower(), (redirect, [], set()))
                if vs.key in entry[2]:
                    continue
                entry[2].add(vs.key)
                if routes is None:
                    routes = vs_routes(index, vs, port, namespace, scope)
                entry[1].extend(routes)
    return tuple((host, redirect, tuple(routes)) for host, (redirect, routes, _) in hosts.items())


def _domains(host: str, port: int) -> list[str]:
    return ["*"] if host == "*" else [host, f"{host}:{port}"]


def build(name: str, port: int, vhosts: tuple[GatewayVhost, ...]) -> RouteConfiguration:
    config = RouteConfiguration(
        name=name,
        # Clusters arrive in their own response; a route may come first (see route_tables).
        validate_clusters=BoolValue(value=False),
    )
    for host, redirect, routes in vhosts:
        vhost = VirtualHost(
            name=f"{host}:{port}",
            domains=_domains(host, port),
            routes=[r for spec in routes for r in build_route(spec)],
        )
        if redirect:
            vhost.require_tls = VirtualHost.ALL
        config.virtual_hosts.append(vhost)
    return config
