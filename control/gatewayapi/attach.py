"""Where one Gateway API route attaches and what it serves there (sans-IO).

A route's translation reads the route and the `Context`: the GatewayClasses, Gateways (their
listeners judged once), ReferenceGrants, Services, Secrets and namespace labels of the config.
It never reads another route, so translate.py keeps each route's `RouteOutput` for as long as
the route and the context stay the same, and joins the outputs of all routes: HTTP and gRPC
matches per (Gateway, port, host), TLS and TCP VirtualServices, listener attachments, statuses.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from control.gatewayapi.backends import Backends, unresolved
from control.gatewayapi.hostnames import route_hosts
from control.gatewayapi.http_routes import Attached, attached, rule_target
from control.gatewayapi.listeners import (
    GatewayState,
    ListenerState,
    bad,
    gateway_state,
    model_gateway,
    ok,
)
from control.model.gateway import Gateway
from control.model.gatewayapi import (
    GROUP,
    NAMESPACE_NAME_LABEL,
    ApiGateway,
    ApiRoute,
    Condition,
    FromNamespaces,
    GatewayClass,
    Listener,
    ObjectStatus,
    ParentRef,
    ParentStatus,
    ReferenceGrant,
    RouteKind,
)
from control.model.traffic import Destination, TcpRoute, TlsRoute, VirtualService
from control.model.types import ConfigWarning, Labels, Service

NamespaceLabels = Callable[[str], Labels]
RouteKey = tuple[str, str, str]  # (kind, namespace, name)
HttpKey = tuple[str, str, int, str]  # (Gateway namespace, Gateway name, port, host)
ListenerKey = tuple[str, str, int]  # (Gateway namespace, Gateway name, listener position)


def route_key(route: ApiRoute) -> RouteKey:
    return (route.kind.value, route.namespace, route.name)


def route_order(route: ApiRoute) -> tuple[str, str, str, str]:
    """Routes are taken oldest first, then by namespace/name (the spec's tie-breaks)."""
    return (route.created, route.namespace, route.name, route.kind.value)


@dataclass(frozen=True, slots=True)
class RouteOutput:
    """What one route contributes: its status (None when no parentRef is ours), its matches
    per (Gateway, port, host), its TLS/TCP VirtualServices, the listeners it is attached to,
    and its warnings."""

    status: ObjectStatus | None
    http: tuple[tuple[HttpKey, tuple[Attached, ...]], ...]
    streams: tuple[VirtualService, ...]
    attached: frozenset[ListenerKey]
    warnings: tuple[ConfigWarning, ...]


class Context:
    """Everything of one config a route's translation reads besides the route, judged once:
    our GatewayClasses, each Gateway's listeners, the backends' Services and grants.
    `namespace_labels` may be swapped for a newer callable that answers the same (translate.py
    checks the namespaces asked so far before reusing a context)."""

    def __init__(
        self,
        classes: Iterable[GatewayClass],
        gateways: Iterable[ApiGateway],
        grants: tuple[ReferenceGrant, ...],
        services: Iterable[Service],
        namespace_labels: NamespaceLabels,
        secrets: Collection[tuple[str, str]] | None,
    ) -> None:
        self.classes = {o.name: o for o in classes}
        gateways = list(gateways)
        self.gateway_keys = {(g.namespace, g.name) for g in gateways}
        self.grants = grants
        self.backends = Backends(services, grants)
        self.namespace_labels = namespace_labels
        # Every namespace whose labels a route's translation read, with what they were.
        self.labels_asked: dict[str, Labels] = {}
        self.states: dict[tuple[str, str], GatewayState] = {
            (gw.namespace, gw.name): gateway_state(gw, grants, secrets)
            for gw in gateways
            if self._ours(gw.class_name)
        }
        warnings: list[ConfigWarning] = []
        self.gateways: tuple[Gateway, ...] = tuple(
            sorted((model_gateway(s, warnings) for s in self.states.values()), key=lambda g: g.key)
        )
        self.warnings = tuple(warnings)
        self.class_statuses = tuple(
            ObjectStatus("GatewayClass", "", gc.name, gc.generation, (ok("Accepted"),))
            for gc in sorted(self.classes.values(), key=lambda c: c.name)
            if gc.ours
        )

    def _ours(self, class_name: str) -> bool:
        gc = self.classes.get(class_name)
        return gc is not None and gc.ours

    def labels(self, namespace: str) -> Labels:
        got = self.labels_asked.get(namespace)
        if got is None:
            got = self.labels_asked[namespace] = self.namespace_labels(namespace)
        return got

    def labels_still_hold(self, namespace_labels: NamespaceLabels) -> bool:
        return all(namespace_labels(ns) == had for ns, had in self.labels_asked.items())


def translate_route(ctx: Context, route: ApiRoute) -> RouteOutput:
    return _Route(ctx, route).output()


class _Route:
    """One route's translation against a context."""

    def __init__(self, ctx: Context, route: ApiRoute) -> None:
        self.ctx = ctx
        self.route = route
        self.warnings: list[ConfigWarning] = []
        self.attached: set[ListenerKey] = set()
        # What is already served, so a route attached through two listeners of one port is
        # served once there.
        self.served: set[tuple[object, ...]] = set()
        self.http: dict[HttpKey, list[Attached]] = {}
        self.streams: dict[tuple[str, str], VirtualService] = {}

    def output(self) -> RouteOutput:
        ctx, route = self.ctx, self.route
        problems: list[tuple[str, str]] = []
        destinations = ctx.backends.destinations(route, problems)
        resolved = (
            bad("ResolvedRefs", problems[0][0], "; ".join(m for _, m in problems))
            if problems
            else ok("ResolvedRefs")
        )
        parents: list[ParentStatus] = []
        for parent in route.parents:
            if (parent.group, parent.kind) != (GROUP, "Gateway"):
                continue  # a parent of another kind (a mesh Service, ...) is not ours
            state = ctx.states.get((parent.namespace, parent.name))
            if state is None and (parent.namespace, parent.name) in ctx.gateway_keys:
                continue  # a Gateway of another controller
            accepted, where = self._attach(parent, state)
            parents.append(ParentStatus(parent, (accepted, resolved)))
            for at, ls, hosts in where:
                assert state is not None  # `where` is empty without a Gateway
                gw = state.gateway
                self.attached.add((gw.namespace, gw.name, at))
                self._serve(state, ls, hosts, destinations)
        status = (
            ObjectStatus(
                route.kind.value,
                route.namespace,
                route.name,
                route.generation,
                parents=tuple(parents),
            )
            if parents
            else None
        )
        return RouteOutput(
            status=status,
            http=tuple((key, tuple(items)) for key, items in self.http.items() if items),
            streams=tuple(self.streams.values()),
            attached=frozenset(self.attached),
            warnings=tuple(self.warnings),
        )

    def _namespace_allowed(self, listener: Listener, gw: ApiGateway) -> bool:
        namespace = self.route.namespace
        if listener.from_namespaces is FromNamespaces.ALL:
            return True
        if listener.from_namespaces is FromNamespaces.SAME:
            return namespace == gw.namespace
        labels = dict(self.ctx.labels(namespace))
        labels.setdefault(NAMESPACE_NAME_LABEL, namespace)
        selector = listener.namespace_selector
        return selector is not None and selector.matches(tuple(sorted(labels.items())))

    def _attach(
        self, parent: ParentRef, state: GatewayState | None
    ) -> tuple[Condition, list[tuple[int, ListenerState, tuple[str, ...]]]]:
        """Where the route attaches under one parentRef (its Gateway: `state`): the Accepted
        condition and the listeners (with their positions) with the hosts it serves there."""
        route = self.route
        if state is None:
            return (
                bad("Accepted", "NoMatchingParent", f"no Gateway {parent.namespace}/{parent.name}"),
                [],
            )
        candidates = [
            (at, ls)
            for at, ls in enumerate(state.listeners)
            if (not parent.section_name or ls.listener.name == parent.section_name)
            and (parent.port is None or ls.listener.port == parent.port)
        ]
        if not candidates:
            return bad("Accepted", "NoMatchingParent", "no listener matches sectionName/port"), []
        allowed = [
            (at, ls)
            for at, ls in candidates
            if ls.programmed
            and route.group_kind in ls.kinds
            and self._namespace_allowed(ls.listener, state.gateway)
        ]
        if not allowed:
            return (
                bad(
                    "Accepted",
                    "NotAllowedByListeners",
                    f"no listener of {state.ref} allows {route.kind.value} from namespace "
                    f"{route.namespace}",
                ),
                [],
            )
        out = []
        for at, ls in allowed:
            hosts = route_hosts(ls.listener.hostname, route.hostnames)
            if hosts:
                out.append((at, ls, hosts))
        if not out:
            return (
                bad(
                    "Accepted",
                    "NoMatchingListenerHostname",
                    "no hostname of the route matches a listener hostname",
                ),
                [],
            )
        return ok("Accepted"), out

    def _serve(
        self,
        state: GatewayState,
        ls: ListenerState,
        hosts: tuple[str, ...],
        destinations: list[tuple[Destination, ...]],
    ) -> None:
        """The route on one listener: a TLS or TCP route is one VirtualService per (route,
        port); an HTTP or gRPC route's matches join each host's list."""
        route = self.route
        gw = state.gateway
        port = ls.listener.port
        if route.kind in (RouteKind.TLS, RouteKind.TCP):
            dests = tuple(d for rule in destinations for d in rule if not unresolved(d))
            name = f"{route.kind.value.lower()}-{route.namespace}-{route.name}-{port}"
            if not dests or (gw.namespace, name) in self.streams:
                return  # nothing to send it to, or attached through two listeners of the port
            vs = _stream_virtual_service(route, state, name, port, hosts, dests)
            self.streams[(gw.namespace, name)] = vs
            return
        for host in hosts:
            items = self.http.setdefault((gw.namespace, gw.name, port, host), [])
            for r, (rule, dests) in enumerate(zip(route.rules, destinations, strict=True)):
                target = rule_target(rule, dests)
                mirror = self.ctx.backends.mirror(route, rule, self.warnings)
                for m, match in enumerate(rule.matches):
                    item = attached(route, r, m, match, port, target, mirror)
                    seen = (gw.namespace, gw.name, port, host, *item.order[-2:])
                    if seen in self.served:
                        continue  # attached through two listeners of the same port
                    self.served.add(seen)
                    items.append(item)


def _stream_virtual_service(
    route: ApiRoute,
    state: GatewayState,
    name: str,
    port: int,
    hosts: tuple[str, ...],
    dests: tuple[Destination, ...],
) -> VirtualService:
    tls = (TlsRoute(sni_hosts=hosts, ports=(port,), destinations=dests),)
    tcp = (TcpRoute(ports=(port,), destinations=dests),)
    return VirtualService(
        namespace=state.gateway.namespace,
        name=name,
        source=route.source,
        hosts=hosts if route.kind is RouteKind.TLS else ("*",),
        tls=tls if route.kind is RouteKind.TLS else (),
        tcp=tcp if route.kind is RouteKind.TCP else (),
        gateways=(state.ref,),
    )
