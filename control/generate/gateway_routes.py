"""RDS for a router: `http.<port>` for each plaintext HTTP port (all its servers), and
`https.<port>.<name>.<gateway>.<namespace>` for each terminated HTTPS server, as Istio names
them.

Virtual hosts come from the VirtualServices bound to the servers (model/gateway_index.py):
one per host a VirtualService serves through a server (the intersection of its hosts with the
server's), with domains `host` and `host:port`. Several VirtualServices for one host merge
their routes in (namespace, name) order, as Istio merges them at a gateway; each
VirtualService's HTTP routes translate as for sidecars (route_tables.vs_routes). A request for
a host nothing serves gets Envoy's 404; a server with `httpsRedirect` answers 301 to https.

A push after one VirtualService changed costs that VirtualService: each table's translations
and virtual host bytes are carried from push to push (route_tables.renew_vs_routes) and the
table is assembled from its hosts' bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from envoy.config.route.v3.route_components_pb2 import VirtualHost
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from google.protobuf.wrappers_pb2 import BoolValue

from control.generate.context import GenContext, variant_resource
from control.generate.gateway_listeners import http_route_name, router_listeners
from control.generate.resource_names import ROUTE_TYPE
from control.generate.route_tables import ROUTE_SLICES, RoutesEntry, renew_vs_routes
from control.generate.route_translation import RouteSpec, build_route
from control.model.gateway_index import BoundServer, PortKind
from control.model.proxy import Proxy
from control.model.types import Protocol
from control.xds.cache import Resource, ResourceSet

# (host, https redirect, routes of each VirtualService serving it): everything one virtual
# host's bytes are made of.
GatewayVhost = tuple[str, bool, tuple[tuple[RouteSpec, ...], ...]]


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
    table = ctx.renewed(
        ("gateway-rds-table", name, servers, namespace, scope),
        lambda old: _renew_table(ctx, old, servers, namespace, scope),
    )
    vhosts = table.vhosts
    # The finished virtual hosts are the whole content: one changed host is a new key whose
    # table is assembled from the others' bytes, not rebuilt.
    key = (name, vhosts)
    return variant_resource(ctx, ROUTE_TYPE, name, key, lambda: assemble(name, vhosts))


@dataclass(frozen=True, slots=True)
class _Table:
    """One route table as a push made it, for the next push to renew: each bound
    VirtualService's translation by (server position, id of the VirtualService: the entry
    holds it), each virtual host's parts and bytes by (host, https redirect)."""

    routes: dict[tuple[int, int], RoutesEntry]
    hosts: dict[tuple[str, bool], tuple[tuple[tuple[RouteSpec, ...], ...], bytes]]
    vhosts: tuple[bytes, ...]


def _renew_table(
    ctx: GenContext,
    old: _Table | None,
    servers: tuple[BoundServer, ...],
    namespace: str,
    scope: str,
) -> _Table:
    """Virtual hosts in the order their hosts first appear (servers in precedence order,
    then VirtualServices by namespace/name); a host's routes are every bound
    VirtualService's for it, in that order. What the previous push made (`old`) is reused
    wherever its inputs are the same objects, so one changed VirtualService costs that one
    (plus a look at each of the others)."""
    index = ctx.index
    old_routes = old.routes if old is not None else {}
    old_hosts = old.hosts if old is not None else {}
    rules_same = ctx.unchanged(ROUTE_SLICES)
    routes: dict[tuple[int, int], RoutesEntry] = {}
    hosts: dict[str, tuple[bool, list[tuple[RouteSpec, ...]], set[tuple[str, str]]]] = {}
    for position, bound in enumerate(servers):
        redirect = bound.server.tls is not None and bound.server.tls.https_redirect
        port = bound.server.port
        for vs, served in index.gateway_bindings(bound):
            key = (position, id(vs))
            entry = renew_vs_routes(
                index, old_routes.get(key), vs, port, namespace, scope, rules_same
            )
            routes[key] = entry
            for host in served:
                found = hosts.get(host)
                if found is None:
                    hosts[host] = (redirect, [entry[2]], {vs.key})
                elif vs.key not in found[2]:
                    found[2].add(vs.key)
                    found[1].append(entry[2])
    port = servers[0].server.port
    made: dict[tuple[str, bool], tuple[tuple[tuple[RouteSpec, ...], ...], bytes]] = {}
    for host, (redirect, parts, _) in hosts.items():
        done = tuple(parts)
        before = old_hosts.get((host, redirect))
        # The parts are the carried tuples themselves when unchanged: compared by identity.
        if before is None or before[0] != done:
            before = (done, vhost_bytes(host, port, redirect, done))
        made[(host, redirect)] = before
    return _Table(routes, made, tuple(v for _, v in made.values()))


def _domains(host: str, port: int) -> list[str]:
    return ["*"] if host == "*" else [host, f"{host}:{port}"]


def vhost_bytes(
    host: str, port: int, redirect: bool, parts: tuple[tuple[RouteSpec, ...], ...]
) -> bytes:
    """A virtual host as the bytes of a RouteConfiguration holding only it: joined, such
    pieces are the encoding of the `virtual_hosts` field of the whole table."""
    vhost = VirtualHost(
        name=f"{host}:{port}",
        domains=_domains(host, port),
        routes=[r for routes in parts for spec in routes for r in build_route(spec)],
    )
    if redirect:
        vhost.require_tls = VirtualHost.ALL
    data: bytes = RouteConfiguration(virtual_hosts=[vhost]).SerializeToString(deterministic=True)
    return data


def assemble(name: str, vhosts: tuple[bytes, ...]) -> RouteConfiguration:
    config = RouteConfiguration(
        name=name,
        # Clusters arrive in their own response; a route may come first (see route_tables).
        validate_clusters=BoolValue(value=False),
    )
    # Parsing appends each piece's virtual host, in order (repeated fields concatenate).
    config.MergeFromString(b"".join(vhosts))
    return config
