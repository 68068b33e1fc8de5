"""RDS for a router: `http.<port>` for each plaintext HTTP port (all its servers), and
`https.<port>.<name>.<gateway>.<namespace>` for each terminated HTTPS server, as Istio names
them.

Virtual hosts come from the VirtualServices bound to the servers (model/gateway_index.py):
one per host a VirtualService serves through a server (the intersection of its hosts with the
server's), with domains `host` and `host:port`. Several VirtualServices for one host merge
their routes in (namespace, name) order, as Istio merges them at a gateway; each
VirtualService's HTTP routes translate as for sidecars (route_tables.vs_routes), the router
being the client: a `sourceLabels` match applies when the router pod's own labels satisfy
it, as in Istio. A request for a host nothing serves gets Envoy's 404; a server with
`httpsRedirect` answers 301 to https.

A push after one VirtualService changed costs that VirtualService: each table's translations
and virtual host bytes are carried from push to push (route_tables.renew_vs_routes) and the
table's bytes are joined from its hosts' encodings. When VirtualServices were only replaced
in place (an edited route: same name, same hosts) the carried table is patched: those are
translated again and the hosts they serve rebuilt, without looking at the others; anything
else (a route added or removed, hosts or gateways changed, services or DestinationRules
changed) walks every binding, reusing what still holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress
from operator import is_not

from envoy.config.route.v3.route_components_pb2 import VirtualHost
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from google.protobuf.wrappers_pb2 import BoolValue

from control.generate.context import GenContext
from control.generate.filters import direct_body_limit
from control.generate.gateway_listeners import http_route_name, router_listeners
from control.generate.resource_names import ROUTE_TYPE
from control.generate.route_tables import (
    ROUTE_SLICES,
    RoutesEntry,
    renew_vs_routes,
    source_signature,
)
from control.generate.route_translation import RouteSpec, build_route
from control.model.gateway_index import Binding, BoundServer, PortKind
from control.model.proxy import Proxy
from control.model.traffic import VirtualService
from control.model.types import Labels, Protocol
from control.xds.cache import Resource, ResourceSet
from protos import wire

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
        scope = ctx.index.traffic_scope(proxy.namespace, proxy.labels)
        client = _Client(proxy.namespace, scope, proxy.labels)
        return ResourceSet(
            [_resource(ctx, name, tuple(servers), client) for name, servers in tables.items()]
        )

    return ctx.memo(("gateway-rds", proxy.labels, proxy.namespace, bind), build_all)


@dataclass(frozen=True, slots=True)
class _Client:
    """The router the routes are for: `sourceNamespace` and `sourceLabels` match against its
    namespace and its pod's labels, as Istio matches them at a gateway."""

    namespace: str
    scope: str
    labels: Labels


def _resource(
    ctx: GenContext, name: str, servers: tuple[BoundServer, ...], client: _Client
) -> Resource:
    # Routers whose labels satisfy the same `sourceLabels` selectors share a table (with no
    # such selectors in the mesh, all of them); the labels themselves stay out of the key.
    sources = source_signature(ctx, client.labels, gateways=True)
    table = ctx.renewed(
        ("gateway-rds-table", name, servers, client.namespace, client.scope, sources),
        lambda old: _renew_table(ctx, old, servers, client),
    )
    vhosts = table.vhosts
    # The finished virtual hosts are the whole content: one changed host is a new key whose
    # table is joined from the others' bytes, not rebuilt.
    key = (name, vhosts)
    return ctx.cache.get_encoded(ROUTE_TYPE, name, key, lambda: encoded(name, vhosts), key)


@dataclass(frozen=True, slots=True)
class _Host:
    """One virtual host of a table: where its routes come from, what they are, its bytes."""

    redirect: bool
    # (server position, binding position) of each VirtualService serving the host, the
    # first binding of each (namespace, name), in order.
    members: tuple[tuple[int, int], ...]
    parts: tuple[tuple[RouteSpec, ...], ...]
    data: bytes
    slot: int  # its place in the table's virtual hosts


@dataclass(frozen=True, slots=True)
class _Table:
    """One route table as a push made it, for the next push to renew: the bindings of each
    server as the index gave them, each binding's translation (aligned with them), each
    virtual host by host, and the virtual hosts' bytes in order."""

    bindings: tuple[tuple[Binding, ...], ...]
    routes: tuple[tuple[RoutesEntry, ...], ...]
    hosts: dict[str, _Host]
    vhosts: tuple[bytes, ...]


def _renew_table(
    ctx: GenContext,
    old: _Table | None,
    servers: tuple[BoundServer, ...],
    client: _Client,
) -> _Table:
    """The table of this push: `old` patched where only some VirtualServices were replaced
    in place (same names, same hosts: an edited route), else made again from what `old`
    holds (_rebuilt_table)."""
    bindings = tuple(ctx.index.gateway_bindings(bound) for bound in servers)
    rules_same = ctx.unchanged(ROUTE_SLICES)
    if old is not None and rules_same:
        patched = _patched_table(ctx, old, bindings, servers, client)
        if patched is not None:
            return patched
    return _rebuilt_table(ctx, old, bindings, servers, client, rules_same)


def _patched_table(
    ctx: GenContext,
    old: _Table,
    bindings: tuple[tuple[Binding, ...], ...],
    servers: tuple[BoundServer, ...],
    client: _Client,
) -> _Table | None:
    """`old` with the bindings that are new objects translated again and the virtual hosts
    they serve made again; the rest is taken as it is (services and DestinationRules are
    unchanged, so an unchanged binding's translation holds). None when a binding was added,
    removed, or serves other hosts or under another name than the one it replaces: the
    order of the virtual hosts may then change."""
    if all(a is b for a, b in zip(old.bindings, bindings, strict=True)):
        return old
    routes = list(old.routes)
    dirty: set[str] = set()
    for position, (was, now) in enumerate(zip(old.bindings, bindings, strict=True)):
        if was is now:
            continue
        if len(was) != len(now):
            return None
        port = servers[position].server.port
        entries = list(routes[position])
        for i in compress(range(len(now)), map(is_not, was, now)):
            (before, served), (vs, serves) = was[i], now[i]
            if serves != served or vs.key != before.key:
                return None
            entries[i] = _renew_routes(ctx, None, vs, port, client, True)
            dirty.update(serves)
        routes[position] = tuple(entries)
    hosts = dict(old.hosts)
    vhosts = list(old.vhosts)
    port = servers[0].server.port
    for host in dirty:
        was_host = hosts[host]
        parts = tuple(routes[p][i][2] for p, i in was_host.members)
        if parts != was_host.parts:
            data = vhost_bytes(host, port, was_host.redirect, parts)
            hosts[host] = _Host(was_host.redirect, was_host.members, parts, data, was_host.slot)
            vhosts[was_host.slot] = data
    return _Table(bindings, tuple(routes), hosts, tuple(vhosts))


def _rebuilt_table(
    ctx: GenContext,
    old: _Table | None,
    bindings: tuple[tuple[Binding, ...], ...],
    servers: tuple[BoundServer, ...],
    client: _Client,
    rules_same: bool,
) -> _Table:
    """Virtual hosts in the order their hosts first appear (servers in precedence order,
    then VirtualServices by namespace/name); a host's routes are every bound
    VirtualService's for it, in that order. What the previous push made (`old`) is reused
    wherever its inputs are the same objects, so one changed VirtualService costs that one
    (plus a look at each of the others)."""
    old_routes: dict[tuple[int, int], RoutesEntry] = {}
    old_hosts: dict[str, _Host] = {}
    if old is not None:
        old_routes = {
            (position, id(entry[0])): entry
            for position, entries in enumerate(old.routes)
            for entry in entries
        }
        old_hosts = old.hosts
    routes: list[tuple[RoutesEntry, ...]] = []
    found: dict[str, tuple[bool, list[tuple[int, int]], set[tuple[str, str]]]] = {}
    for position, (bound, bound_here) in enumerate(zip(servers, bindings, strict=True)):
        redirect = bound.server.tls is not None and bound.server.tls.https_redirect
        port = bound.server.port
        entries: list[RoutesEntry] = []
        for i, (vs, served) in enumerate(bound_here):
            entries.append(
                _renew_routes(ctx, old_routes.get((position, id(vs))), vs, port, client, rules_same)
            )
            for host in served:
                seen = found.get(host)
                if seen is None:
                    found[host] = (redirect, [(position, i)], {vs.key})
                elif vs.key not in seen[2]:
                    seen[2].add(vs.key)
                    seen[1].append((position, i))
        routes.append(tuple(entries))
    port = servers[0].server.port
    hosts: dict[str, _Host] = {}
    for slot, (host, (redirect, members, _)) in enumerate(found.items()):
        parts = tuple(routes[p][i][2] for p, i in members)
        before = old_hosts.get(host)
        # The parts are the carried tuples themselves when unchanged: compared by identity.
        if before is not None and before.redirect == redirect and before.parts == parts:
            data = before.data
        else:
            data = vhost_bytes(host, port, redirect, parts)
        hosts[host] = _Host(redirect, tuple(members), parts, data, slot)
    return _Table(bindings, tuple(routes), hosts, tuple(h.data for h in hosts.values()))


def _renew_routes(
    ctx: GenContext,
    old: RoutesEntry | None,
    vs: VirtualService,
    port: int,
    client: _Client,
    rules_same: bool,
) -> RoutesEntry:
    return renew_vs_routes(
        ctx.index, old, vs, port, client.namespace, client.scope, rules_same, client.labels
    )


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


# The fields after the virtual hosts, as route_tables sets them: `validate_clusters` (7)
# false, since clusters arrive in their own response and a route may come first, and
# `max_direct_response_body_size_bytes` (11).
_TRAILER: bytes = RouteConfiguration(
    validate_clusters=BoolValue(value=False),
    max_direct_response_body_size_bytes=direct_body_limit(),
).SerializeToString(deterministic=True)


def encoded(name: str, vhosts: tuple[bytes, ...]) -> bytes:
    """The deterministic serialization of the table: its fields in number order, name (1),
    the virtual hosts (2: each piece is one encoded element), then _TRAILER's (7, 11).
    Joined, not parsed and serialized again: a one-host change to a table of thousands
    costs the copy of their bytes."""
    label = name.encode()
    return b"".join((wire.tag(1), wire.varint(len(label)), label, *vhosts, _TRAILER))
