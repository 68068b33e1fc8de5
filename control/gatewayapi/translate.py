"""Gateway API objects -> model Gateways and VirtualServices, with their status (sans-IO).

As Istio does: a Gateway of one of our GatewayClasses becomes one model `Gateway` in its
namespace, selecting routers labelled `gateway.networking.k8s.io/gateway-name: <name>`; each
valid listener is one server (`*/<hostname>`). Routes attached to it become VirtualServices
in the Gateway's namespace bound to it (`gateways: [<ns>/<name>]`): HTTP and gRPC routes one
VirtualService per (port, host), holding every attached rule of every route for that host in
the Gateway API's precedence order (exact path, longest prefix, method, most headers, most
query parameters, then the oldest route, then by namespace/name), one model route per match
with the listener's port in the match (so a route attached through one listener is not served
on another port); TLS and TCP routes one VirtualService per (route, port).

Everything is decided here, from the whole config at once: which parents accept a route
(allowedRoutes namespaces and kinds, sectionName, port, hostnames), which references resolve
(Services and their ports, ReferenceGrants for other namespaces, certificate Secrets), and the
status of every object we own, with the spec's condition types and reasons.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from control.gatewayapi.backends import Backends, unresolved
from control.gatewayapi.hostnames import route_hosts
from control.gatewayapi.http_routes import (
    Attached,
    attached,
    http_virtual_service,
    rule_target,
)
from control.gatewayapi.listeners import (
    GatewayState,
    ListenerState,
    bad,
    gateway_state,
    gateway_status,
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
    GatewayApiObject,
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


@dataclass(frozen=True, slots=True)
class Translation:
    gateways: tuple[Gateway, ...] = ()
    virtual_services: tuple[VirtualService, ...] = ()
    statuses: tuple[ObjectStatus, ...] = ()
    reference_grants: tuple[ReferenceGrant, ...] = ()
    warnings: tuple[ConfigWarning, ...] = ()


class Translator:
    """One translation of a complete config; `translate()` is the entry point. Listener
    validity is judged in listeners.py, backendRefs in backends.py, HTTP rules in
    http_routes.py; what is decided here is where each route attaches."""

    def __init__(
        self,
        objects: Sequence[GatewayApiObject],
        services: Iterable[Service],
        namespace_labels: NamespaceLabels,
        secrets: Collection[tuple[str, str]] | None,
    ) -> None:
        self.classes = {o.name: o for o in objects if isinstance(o, GatewayClass)}
        self.gateways = [o for o in objects if isinstance(o, ApiGateway)]
        self.gateway_keys = {(g.namespace, g.name) for g in self.gateways}
        self.routes = sorted(
            (o for o in objects if isinstance(o, ApiRoute)),
            key=lambda r: (r.created, r.namespace, r.name, r.kind.value),
        )
        self.grants = tuple(o for o in objects if isinstance(o, ReferenceGrant))
        self.namespace_labels = namespace_labels
        self.secrets = secrets
        self.warnings: list[ConfigWarning] = []
        self.statuses: list[ObjectStatus] = []
        self.backends = Backends(services, self.grants, self.warnings)
        # What is already served, so a route attached through two listeners of one port
        # is served once there.
        self._served: set[tuple[object, ...]] = set()
        self._stream_names: set[tuple[str, str]] = set()
        # What is served: HTTP routes per (Gateway namespace, name, port, host); TLS and TCP
        # routes as their VirtualServices.
        self._http: dict[tuple[str, str, int, str], list[Attached]] = {}
        self._streams: list[VirtualService] = []

    def _ours(self, class_name: str) -> bool:
        gc = self.classes.get(class_name)
        return gc is not None and gc.ours

    # --- the whole translation -------------------------------------------------------------

    def translate(self) -> Translation:
        for gc in sorted(self.classes.values(), key=lambda c: c.name):
            if gc.ours:
                self.statuses.append(
                    ObjectStatus("GatewayClass", "", gc.name, gc.generation, (ok("Accepted"),))
                )
        states: dict[tuple[str, str], GatewayState] = {}
        for gw in self.gateways:
            if self._ours(gw.class_name):
                states[(gw.namespace, gw.name)] = gateway_state(gw, self.grants, self.secrets)
        for route in self.routes:
            self._route(route, states)
        virtual_services = []
        for key, items in self._http.items():
            if items:
                state = states[key[:2]]
                virtual_services.append(
                    http_virtual_service(key, items, state.ref, state.gateway.source)
                )
        virtual_services.extend(self._streams)
        gateways = [model_gateway(s, self.warnings) for s in states.values()]
        for state in states.values():
            self.statuses.append(gateway_status(state))
        self.statuses.sort(key=lambda s: (s.kind, s.namespace, s.name))
        return Translation(
            gateways=tuple(sorted(gateways, key=lambda g: g.key)),
            virtual_services=tuple(sorted(virtual_services, key=lambda v: v.key)),
            statuses=tuple(self.statuses),
            reference_grants=self.grants,
            warnings=tuple(dict.fromkeys(self.warnings)),
        )

    # --- routes ----------------------------------------------------------------------------

    def _namespace_allowed(self, listener: Listener, gw: ApiGateway, namespace: str) -> bool:
        if listener.from_namespaces is FromNamespaces.ALL:
            return True
        if listener.from_namespaces is FromNamespaces.SAME:
            return namespace == gw.namespace
        labels = dict(self.namespace_labels(namespace))
        labels.setdefault(NAMESPACE_NAME_LABEL, namespace)
        selector = listener.namespace_selector
        return selector is not None and selector.matches(tuple(sorted(labels.items())))

    def _attach(
        self, route: ApiRoute, parent: ParentRef, state: GatewayState | None
    ) -> tuple[Condition, list[tuple[ListenerState, tuple[str, ...]]]]:
        """Where a route attaches under one parentRef (its Gateway: `state`): the Accepted
        condition and the listeners with the hosts it serves there."""
        if state is None:
            return (
                bad("Accepted", "NoMatchingParent", f"no Gateway {parent.namespace}/{parent.name}"),
                [],
            )
        candidates = [
            ls
            for ls in state.listeners
            if (not parent.section_name or ls.listener.name == parent.section_name)
            and (parent.port is None or ls.listener.port == parent.port)
        ]
        if not candidates:
            return bad("Accepted", "NoMatchingParent", "no listener matches sectionName/port"), []
        allowed = [
            ls
            for ls in candidates
            if ls.programmed
            and route.group_kind in ls.kinds
            and self._namespace_allowed(ls.listener, state.gateway, route.namespace)
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
        for ls in allowed:
            hosts = route_hosts(ls.listener.hostname, route.hostnames)
            if hosts:
                out.append((ls, hosts))
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

    def _route(self, route: ApiRoute, states: dict[tuple[str, str], GatewayState]) -> None:
        problems: list[tuple[str, str]] = []
        destinations = self.backends.destinations(route, problems)
        resolved = (
            bad("ResolvedRefs", problems[0][0], "; ".join(m for _, m in problems))
            if problems
            else ok("ResolvedRefs")
        )
        parents: list[ParentStatus] = []
        for parent in route.parents:
            if (parent.group, parent.kind) != (GROUP, "Gateway"):
                continue  # a parent of another kind (a mesh Service, ...) is not ours
            state = states.get((parent.namespace, parent.name))
            if state is None and (parent.namespace, parent.name) in self.gateway_keys:
                continue  # a Gateway of another controller
            accepted, where = self._attach(route, parent, state)
            parents.append(ParentStatus(parent, (accepted, resolved)))
            for ls, hosts in where:
                assert state is not None  # `where` is empty without a Gateway
                ls.attached.add((route.kind.value, route.namespace, route.name))
                self._serve(route, state, ls, hosts, destinations)
        if parents:
            self.statuses.append(
                ObjectStatus(
                    route.kind.value,
                    route.namespace,
                    route.name,
                    route.generation,
                    parents=tuple(parents),
                )
            )

    def _serve(
        self,
        route: ApiRoute,
        state: GatewayState,
        ls: ListenerState,
        hosts: tuple[str, ...],
        destinations: list[tuple[Destination, ...]],
    ) -> None:
        """One route on one listener: a TLS or TCP route is one VirtualService per (route,
        port); an HTTP or gRPC route's matches join each host's list."""
        gw = state.gateway
        port = ls.listener.port
        if route.kind in (RouteKind.TLS, RouteKind.TCP):
            dests = tuple(d for rule in destinations for d in rule if not unresolved(d))
            name = f"{route.kind.value.lower()}-{route.namespace}-{route.name}-{port}"
            if not dests or (gw.namespace, name) in self._stream_names:
                return  # nothing to send it to, or attached through two listeners of the port
            self._stream_names.add((gw.namespace, name))
            self._streams.append(_stream_virtual_service(route, state, name, port, hosts, dests))
            return
        for host in hosts:
            items = self._http.setdefault((gw.namespace, gw.name, port, host), [])
            for r, (rule, dests) in enumerate(zip(route.rules, destinations, strict=True)):
                target = rule_target(rule, dests)
                mirror = self.backends.mirror(route, rule)
                for m, match in enumerate(rule.matches):
                    item = attached(route, r, m, match, port, target, mirror)
                    seen = (gw.namespace, gw.name, port, host, route.kind, *item.order[-5:])
                    if seen in self._served:
                        continue  # attached through two listeners of the same port
                    self._served.add(seen)
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


def translate(
    objects: Sequence[GatewayApiObject],
    services: Iterable[Service],
    namespace_labels: NamespaceLabels = lambda _ns: (),
    secrets: Collection[tuple[str, str]] | None = None,
) -> Translation:
    """Translate every Gateway API object of one config (see the module docstring).
    `namespace_labels` answers a namespace's labels (allowedRoutes selectors); `secrets`
    holds the (namespace, name) of every known Secret, or None when they are not known (then
    certificateRefs are not checked for existence)."""
    return Translator(objects, services, namespace_labels, secrets).translate()
