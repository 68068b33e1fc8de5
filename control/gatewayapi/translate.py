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

import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace

from control.gatewayapi.hostnames import route_hosts
from control.model.gateway import Gateway, GatewayServer, ServerTls, ServerTlsMode
from control.model.gatewayapi import (
    GATEWAY_NAME_LABEL,
    GROUP,
    GRPC_ROUTE,
    HTTP_ROUTE,
    NAMESPACE_NAME_LABEL,
    SECRET,
    TCP_ROUTE,
    TLS_ROUTE,
    ApiGateway,
    ApiRoute,
    BackendRef,
    Condition,
    FromNamespaces,
    GatewayApiObject,
    GatewayClass,
    GroupKind,
    Listener,
    ListenerStatus,
    ObjectStatus,
    ParentRef,
    ParentStatus,
    ReferenceGrant,
    RouteKind,
    RouteRule,
    TlsMode,
    reference_granted,
)
from control.model.traffic import (
    Destination,
    Fault,
    HttpMatch,
    HttpRoute,
    MatchKind,
    Rewrite,
    StringMatch,
    TcpRoute,
    TlsRoute,
    VirtualService,
)
from control.model.types import ConfigWarning, Labels, Protocol, Service

# Route kinds each listener protocol can carry (and the kinds it allows by default).
_KINDS_BY_PROTOCOL: dict[str, tuple[GroupKind, ...]] = {
    "HTTP": (HTTP_ROUTE, GRPC_ROUTE),
    "HTTPS": (HTTP_ROUTE, GRPC_ROUTE),
    "TLS": (TLS_ROUTE, TCP_ROUTE),
    "TCP": (TCP_ROUTE,),
}
_PROTOCOLS = {
    "HTTP": Protocol.HTTP,
    "HTTPS": Protocol.HTTPS,
    "TLS": Protocol.TLS,
    "TCP": Protocol.TCP,
}

NamespaceLabels = Callable[[str], Labels]


@dataclass(frozen=True, slots=True)
class Translation:
    gateways: tuple[Gateway, ...] = ()
    virtual_services: tuple[VirtualService, ...] = ()
    statuses: tuple[ObjectStatus, ...] = ()
    reference_grants: tuple[ReferenceGrant, ...] = ()
    warnings: tuple[ConfigWarning, ...] = ()


def _ok(kind: str, reason: str = "", message: str = "") -> Condition:
    return Condition(kind, True, reason or kind, message)


def _bad(kind: str, reason: str, message: str) -> Condition:
    return Condition(kind, False, reason, message)


@dataclass
class _ListenerState:
    listener: Listener
    kinds: tuple[GroupKind, ...]
    conditions: dict[str, Condition] = field(default_factory=dict)
    attached: set[tuple[str, str, str]] = field(default_factory=set)  # (kind, ns, name)

    @property
    def programmed(self) -> bool:
        refs = self.conditions["ResolvedRefs"]
        # Kinds it cannot carry are left out; the listener serves the ones it can.
        refs_ok = refs.status or (refs.reason == "InvalidRouteKinds" and bool(self.kinds))
        return (
            self.conditions["Accepted"].status
            and refs_ok
            and not self.conditions["Conflicted"].status
        )


@dataclass
class _GatewayState:
    gateway: ApiGateway
    listeners: list[_ListenerState]

    @property
    def ref(self) -> str:
        return f"{self.gateway.namespace}/{self.gateway.name}"


@dataclass(frozen=True, slots=True)
class _Attached:
    """One route rule match to serve on one (gateway, port, host)."""

    order: tuple[object, ...]
    route: HttpRoute


class Translator:
    """One translation of a complete config; `translate()` is the entry point."""

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
        self.services = {(s.namespace, s.name): s for s in services if s.registry == "Kubernetes"}
        self.namespace_labels = namespace_labels
        self.secrets = secrets
        self.warnings: list[ConfigWarning] = []
        self.statuses: list[ObjectStatus] = []
        # What is already served, so a route attached through two listeners of one port
        # is served once there.
        self._served: set[tuple[object, ...]] = set()
        self._stream_names: set[tuple[str, str]] = set()

    # --- gateways --------------------------------------------------------------------------

    def _ours(self, class_name: str) -> bool:
        gc = self.classes.get(class_name)
        return gc is not None and gc.ours

    def _listener_state(self, gw: ApiGateway, listener: Listener) -> _ListenerState:
        supported = _KINDS_BY_PROTOCOL.get(listener.protocol, ())
        wanted = listener.kinds or supported
        if listener.protocol == "TLS" and not listener.kinds:
            mode = listener.tls_mode or TlsMode.TERMINATE
            wanted = (TLS_ROUTE,) if mode is TlsMode.PASSTHROUGH else (TCP_ROUTE,)
        kinds = tuple(k for k in wanted if k in supported)
        state = _ListenerState(listener, kinds)
        cond = state.conditions
        cond["Conflicted"] = _bad("Conflicted", "NoConflicts", "")
        if listener.protocol not in _PROTOCOLS:
            cond["Accepted"] = _bad(
                "Accepted", "UnsupportedProtocol", f"protocol {listener.protocol} is not supported"
            )
        elif problem := _tls_problem(listener):
            cond["Accepted"] = _bad("Accepted", "UnsupportedValue", problem)
        else:
            cond["Accepted"] = _ok("Accepted")
        cond["ResolvedRefs"] = self._listener_refs(gw, listener, kinds)
        return state

    def _listener_refs(
        self, gw: ApiGateway, listener: Listener, kinds: tuple[GroupKind, ...]
    ) -> Condition:
        terminates = listener.protocol == "HTTPS" or (
            listener.protocol == "TLS" and listener.tls_mode is not TlsMode.PASSTHROUGH
        )
        for ref in listener.certificate_refs if terminates else ():
            what = f"certificateRef {ref.namespace}/{ref.name}"
            if (ref.group, ref.kind) != SECRET:
                return _bad("ResolvedRefs", "InvalidCertificateRef", f"{what}: not a Secret")
            granted = reference_granted(
                self.grants,
                (GROUP, "Gateway", gw.namespace),
                ("", "Secret", ref.namespace, ref.name),
            )
            if not granted:
                return _bad(
                    "ResolvedRefs",
                    "RefNotPermitted",
                    f"{what}: no ReferenceGrant in {ref.namespace} allows it",
                )
            if self.secrets is not None and (ref.namespace, ref.name) not in self.secrets:
                return _bad("ResolvedRefs", "InvalidCertificateRef", f"{what}: no such Secret")
        unsupported = [k for k in listener.kinds if k not in kinds]
        if unsupported:
            names = ", ".join(k for _, k in unsupported)
            return _bad("ResolvedRefs", "InvalidRouteKinds", f"route kinds {names} not supported")
        return _ok("ResolvedRefs")

    def _gateway_state(self, gw: ApiGateway) -> _GatewayState:
        states = [self._listener_state(gw, listener) for listener in gw.listeners]
        seen: dict[int, _ListenerState] = {}
        hosts: dict[tuple[int, str], _ListenerState] = {}
        for state in states:
            listener = state.listener
            first = seen.setdefault(listener.port, state)
            if _family(first.listener.protocol) != _family(listener.protocol):
                state.conditions["Conflicted"] = Condition(
                    "Conflicted",
                    True,
                    "ProtocolConflict",
                    f"port {listener.port} is already {first.listener.protocol} "
                    f"(listener {first.listener.name})",
                )
                continue
            other = hosts.setdefault((listener.port, listener.hostname), state)
            if other is not state:
                state.conditions["Conflicted"] = Condition(
                    "Conflicted",
                    True,
                    "HostnameConflict",
                    f"listener {other.listener.name} has the same port and hostname",
                )
        return _GatewayState(gw, states)

    def _model_gateway(self, state: _GatewayState) -> Gateway:
        gw = state.gateway
        servers: list[GatewayServer] = []
        for ls in state.listeners:
            if not ls.programmed:
                continue
            listener = ls.listener
            servers.append(
                GatewayServer(
                    port=listener.port,
                    protocol=_PROTOCOLS[listener.protocol],
                    port_name=listener.name,
                    hosts=(f"*/{listener.hostname or '*'}",),
                    tls=self._server_tls(gw, listener),
                    name=listener.name,
                )
            )
        return Gateway(
            namespace=gw.namespace,
            name=gw.name,
            source=gw.source,
            selector=((GATEWAY_NAME_LABEL, gw.name),),
            servers=tuple(servers),
            router_namespace=gw.namespace,
        )

    def _server_tls(self, gw: ApiGateway, listener: Listener) -> ServerTls | None:
        if listener.protocol not in ("HTTPS", "TLS"):
            return None
        if listener.tls_mode is TlsMode.PASSTHROUGH:
            return ServerTls(mode=ServerTlsMode.PASSTHROUGH)
        refs = listener.certificate_refs
        if len(refs) > 1:
            self.warnings.append(
                ConfigWarning(
                    gw.source,
                    f"listener {listener.name}: only the first certificateRef is served",
                )
            )
        ref = refs[0]
        name = ref.name if ref.namespace == gw.namespace else f"{ref.namespace}/{ref.name}"
        return ServerTls(mode=ServerTlsMode.SIMPLE, credential_name=name)

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
        self, route: ApiRoute, parent: ParentRef, state: _GatewayState | None
    ) -> tuple[Condition, list[tuple[_ListenerState, tuple[str, ...]]]]:
        """Where a route attaches under one parentRef (its Gateway: `state`): the Accepted
        condition and the listeners with the hosts it serves there."""
        if state is None:
            return (
                _bad(
                    "Accepted", "NoMatchingParent", f"no Gateway {parent.namespace}/{parent.name}"
                ),
                [],
            )
        candidates = [
            ls
            for ls in state.listeners
            if (not parent.section_name or ls.listener.name == parent.section_name)
            and (parent.port is None or ls.listener.port == parent.port)
        ]
        if not candidates:
            return _bad("Accepted", "NoMatchingParent", "no listener matches sectionName/port"), []
        allowed = [
            ls
            for ls in candidates
            if ls.programmed
            and route.group_kind in ls.kinds
            and self._namespace_allowed(ls.listener, state.gateway, route.namespace)
        ]
        if not allowed:
            return (
                _bad(
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
                _bad(
                    "Accepted",
                    "NoMatchingListenerHostname",
                    "no hostname of the route matches a listener hostname",
                ),
                [],
            )
        return _ok("Accepted"), out

    def _resolve(self, route: ApiRoute, backend: BackendRef) -> tuple[Destination | None, str, str]:
        """A backendRef as a destination, or (None, reason, message)."""
        ref = backend.ref
        what = f"backendRef {ref.namespace}/{ref.name}"
        if (ref.group, ref.kind) != ("", "Service"):
            return None, "InvalidKind", f"{what}: kind {ref.kind} is not supported"
        granted = reference_granted(
            self.grants,
            (GROUP, route.kind.value, route.namespace),
            ("", "Service", ref.namespace, ref.name),
        )
        if not granted:
            return (
                None,
                "RefNotPermitted",
                f"{what}: no ReferenceGrant in {ref.namespace} allows it",
            )
        service = self.services.get((ref.namespace, ref.name))
        if service is None:
            return None, "BackendNotFound", f"{what}: no such Service"
        if backend.port is not None and service.port_by_number(backend.port) is None:
            return None, "BackendNotFound", f"{what}: Service has no port {backend.port}"
        dest = Destination(service.hostname, port=backend.port, weight=backend.weight)
        return replace(dest, headers=backend.headers), "", ""

    def _destinations(
        self, route: ApiRoute, problems: list[tuple[str, str]]
    ) -> list[tuple[Destination, ...]]:
        """The destinations of every rule (in order); failures are added to `problems`. An
        HTTP backend that does not resolve keeps its share of the traffic, sent nowhere (an
        `.invalid` host, which has no cluster): the spec wants errors for that share, not
        the valid backends taking it over."""
        out: list[tuple[Destination, ...]] = []
        for rule in route.rules:
            dests: list[Destination] = []
            for backend in rule.backends:
                dest, reason, message = self._resolve(route, backend)
                if dest is None:
                    problems.append((reason, message))
                    if route.kind in (RouteKind.HTTP, RouteKind.GRPC) and backend.weight > 0:
                        host = f"{backend.ref.name}.{backend.ref.namespace}{UNRESOLVED}"
                        dests.append(Destination(host, port=backend.port, weight=backend.weight))
                elif dest.weight > 0:
                    dests.append(dest)
            out.append(tuple(dests))
        return out

    def _mirror(self, route: ApiRoute, rule: RouteRule) -> tuple[Destination | None, float]:
        if not rule.mirrors:
            return None, 100.0
        if len(rule.mirrors) > 1:
            self.warnings.append(
                ConfigWarning(route.source, "only the first RequestMirror of a rule is served")
            )
        mirror = rule.mirrors[0]
        dest, _, _ = self._resolve(route, mirror.backend)
        return (None if dest is None else replace(dest, weight=0)), mirror.percent

    # --- the whole translation -------------------------------------------------------------

    def translate(self) -> Translation:
        for gc in sorted(self.classes.values(), key=lambda c: c.name):
            if gc.ours:
                self.statuses.append(
                    ObjectStatus("GatewayClass", "", gc.name, gc.generation, (_ok("Accepted"),))
                )
        states: dict[tuple[str, str], _GatewayState] = {}
        for gw in self.gateways:
            if self._ours(gw.class_name):
                states[(gw.namespace, gw.name)] = self._gateway_state(gw)
        http: dict[tuple[str, str, int, str], list[_Attached]] = {}
        streams: list[VirtualService] = []
        for route in self.routes:
            self._route(route, states, http, streams)
        virtual_services = [
            self._http_vs(key, items, states) for key, items in http.items() if items
        ]
        virtual_services.extend(streams)
        gateways = [self._model_gateway(s) for s in states.values()]
        for state in states.values():
            self.statuses.append(_gateway_status(state))
        self.statuses.sort(key=lambda s: (s.kind, s.namespace, s.name))
        return Translation(
            gateways=tuple(sorted(gateways, key=lambda g: g.key)),
            virtual_services=tuple(sorted(virtual_services, key=lambda v: v.key)),
            statuses=tuple(self.statuses),
            reference_grants=self.grants,
            warnings=tuple(dict.fromkeys(self.warnings)),
        )

    def _route(
        self,
        route: ApiRoute,
        states: dict[tuple[str, str], _GatewayState],
        http: dict[tuple[str, str, int, str], list[_Attached]],
        streams: list[VirtualService],
    ) -> None:
        problems: list[tuple[str, str]] = []
        destinations = self._destinations(route, problems)
        resolved = (
            _bad("ResolvedRefs", problems[0][0], "; ".join(m for _, m in problems))
            if problems
            else _ok("ResolvedRefs")
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
                self._serve(route, state, ls, hosts, destinations, http, streams)
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
        state: _GatewayState,
        ls: _ListenerState,
        hosts: tuple[str, ...],
        destinations: list[tuple[Destination, ...]],
        http: dict[tuple[str, str, int, str], list[_Attached]],
        streams: list[VirtualService],
    ) -> None:
        gw = state.gateway
        port = ls.listener.port
        if route.kind in (RouteKind.TLS, RouteKind.TCP):
            dests = tuple(d for rule in destinations for d in rule if not _unresolved(d))
            if not dests:
                return
            vs_hosts: tuple[str, ...] = hosts if route.kind is RouteKind.TLS else ("*",)
            name = f"{route.kind.value.lower()}-{route.namespace}-{route.name}-{port}"
            if (gw.namespace, name) in self._stream_names:
                return  # attached through two listeners of the same port
            self._stream_names.add((gw.namespace, name))
            tls = (TlsRoute(sni_hosts=hosts, ports=(port,), destinations=dests),)
            tcp = (TcpRoute(ports=(port,), destinations=dests),)
            streams.append(
                VirtualService(
                    namespace=gw.namespace,
                    name=name,
                    source=route.source,
                    hosts=vs_hosts,
                    tls=tls if route.kind is RouteKind.TLS else (),
                    tcp=tcp if route.kind is RouteKind.TCP else (),
                    gateways=(state.ref,),
                )
            )
            return
        for host in hosts:
            items = http.setdefault((gw.namespace, gw.name, port, host), [])
            for r, (rule, dests) in enumerate(zip(route.rules, destinations, strict=True)):
                fault = None
                if rule.redirect is None and all(_unresolved(d) for d in dests):
                    # Nothing valid to send it to (reported as ResolvedRefs): the spec's 500.
                    fault = Fault(abort_status=500)
                    dests = dests or (Destination(f"no-backend{UNRESOLVED}"),)
                mirror, mirror_percent = self._mirror(route, rule)
                for m, match in enumerate(rule.matches):
                    order = (*_precedence(match), route.created, route.namespace, route.name, r, m)
                    seen = (gw.namespace, gw.name, port, host, route.kind, *order[-5:])
                    if seen in self._served:
                        continue  # attached through two listeners of the same port
                    self._served.add(seen)
                    items.append(
                        _Attached(
                            order,
                            HttpRoute(
                                name=f"{route.namespace}.{route.name}.{r}.{m}",
                                matches=(_port_match(route, match, port),),
                                destinations=dests,
                                redirect=rule.redirect,
                                rewrite=_rewrite(rule, match),
                                timeout=rule.timeout,
                                mirror=mirror,
                                mirror_percent=mirror_percent,
                                headers=rule.headers,
                                fault=fault,
                            ),
                        )
                    )

    def _http_vs(
        self,
        key: tuple[str, str, int, str],
        items: list[_Attached],
        states: dict[tuple[str, str], _GatewayState],
    ) -> VirtualService:
        namespace, name, port, host = key
        state = states[(namespace, name)]
        label = "wildcard" if host == "*" else host.replace("*", "wildcard")
        return VirtualService(
            namespace=namespace,
            name=f"{name}-{port}-{label}",
            source=state.gateway.source,
            hosts=(host,),
            http=tuple(i.route for i in sorted(items, key=lambda i: i.order)),
            gateways=(state.ref,),
        )


# The host of a backend that does not resolve: `.invalid` (RFC 2606) is never a service.
UNRESOLVED = ".invalid"


def _unresolved(dest: Destination) -> bool:
    return dest.host.endswith(UNRESOLVED)


def _family(protocol: str) -> str:
    # HTTPS and TLS share a port by SNI; HTTP and TCP need a port each.
    return {"HTTPS": "TLS"}.get(protocol, protocol)


def _tls_problem(listener: Listener) -> str:
    if listener.protocol in ("HTTP", "TCP") and listener.tls_mode is not None:
        return f"tls is not allowed on a {listener.protocol} listener"
    if listener.protocol == "HTTPS" and listener.tls_mode is TlsMode.PASSTHROUGH:
        return "an HTTPS listener terminates TLS (use protocol TLS for Passthrough)"
    terminates = listener.protocol == "HTTPS" or (
        listener.protocol == "TLS" and listener.tls_mode is not TlsMode.PASSTHROUGH
    )
    if terminates and not listener.certificate_refs:
        return "tls.certificateRefs is required to terminate TLS"
    if listener.protocol == "TLS" and listener.tls_mode is None:
        return "tls.mode is required on a TLS listener"
    return ""


_PATH_RANK = {MatchKind.EXACT: 0, MatchKind.REGEX: 1, MatchKind.PREFIX: 2}


def _precedence(match: HttpMatch) -> tuple[object, ...]:
    uri = match.uri or StringMatch(MatchKind.PREFIX, "/")
    return (
        _PATH_RANK[uri.kind],
        -len(uri.value),
        match.method is None,
        -len(match.headers),
        -len(match.query_params),
    )


def _port_match(route: ApiRoute, match: HttpMatch, port: int) -> HttpMatch:
    """The match as the model states it on one gateway port; a Gateway API PathPrefix is
    path-element-wise (`/foo` matches `/foo` and `/foo/…`, never `/foobar`)."""
    uri = match.uri
    if route.kind is RouteKind.HTTP and uri is not None and uri.kind is MatchKind.PREFIX:
        prefix = uri.value.rstrip("/")
        if prefix:
            uri = StringMatch(MatchKind.REGEX, f"{re.escape(prefix)}(/.*)?")
        else:
            uri = StringMatch(MatchKind.PREFIX, "/")
    return replace(match, uri=uri, port=port)


def _rewrite(rule: RouteRule, match: HttpMatch) -> Rewrite | None:
    if rule.replace_prefix is None:
        return rule.rewrite
    base = rule.rewrite or Rewrite()
    uri = match.uri
    replacement = rule.replace_prefix.rstrip("/")
    if uri is None or uri.kind is not MatchKind.PREFIX:
        return replace(base, uri_regex=("^/.*$", rule.replace_prefix))
    prefix = re.escape(uri.value.rstrip("/"))
    if not replacement:
        return replace(base, uri_regex=(f"^{prefix}/?", "/"))
    if not prefix:
        return replace(base, uri_regex=("^/", f"{replacement}/"))
    return replace(base, uri_regex=(f"^{prefix}", replacement))


def _gateway_status(state: _GatewayState) -> ObjectStatus:
    listeners = []
    for ls in state.listeners:
        programmed = (
            _ok("Programmed")
            if ls.programmed
            else _bad("Programmed", "Invalid", "the listener is not valid (see its conditions)")
        )
        listeners.append(
            ListenerStatus(
                name=ls.listener.name,
                supported_kinds=ls.kinds,
                attached_routes=len(ls.attached),
                conditions=(
                    ls.conditions["Accepted"],
                    ls.conditions["ResolvedRefs"],
                    ls.conditions["Conflicted"],
                    programmed,
                ),
            )
        )
    valid = [ls for ls in state.listeners if ls.programmed]
    if len(valid) == len(state.listeners):
        accepted = _ok("Accepted")
    else:
        accepted = Condition(
            "Accepted", True, "ListenersNotValid", "some listeners are not valid; see listeners"
        )
    programmed = (
        _ok("Programmed") if valid else _bad("Programmed", "Invalid", "no listener is valid")
    )
    gw = state.gateway
    return ObjectStatus(
        "Gateway",
        gw.namespace,
        gw.name,
        gw.generation,
        conditions=(accepted, programmed),
        listeners=tuple(listeners),
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
