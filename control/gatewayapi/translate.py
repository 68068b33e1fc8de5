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

Which parents accept a route (allowedRoutes namespaces and kinds, sectionName, port,
hostnames) and which of its references resolve (Services and their ports, ReferenceGrants for
other namespaces) is decided per route (attach.py), against the rest of the config; listener
validity and certificate Secrets in listeners.py. The status of every object we own has the
spec's condition types and reasons.

A `Translator` keeps what its last translation made. When only routes changed (the
GatewayClasses, Gateways, ReferenceGrants, the Services' names and ports, the Secrets and the
namespace labels read are equal to the last call's), a route equal to the last call's keeps
its output, the very same objects, and only the VirtualServices of the (Gateway, port, host)s
a changed route served or serves are made again; every other VirtualService and status is the
previous object. Any other change translates every route again. `translate()` is a fresh
Translator's answer, which the incremental answers equal.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import is_not
from typing import Protocol, TypeVar

from control.gatewayapi.attach import (
    Context,
    HttpKey,
    ListenerKey,
    NamespaceLabels,
    RouteKey,
    RouteOutput,
    route_key,
    route_order,
    translate_route,
)
from control.gatewayapi.backends import service_facts
from control.gatewayapi.http_routes import Attached, http_virtual_service
from control.gatewayapi.listeners import gateway_status
from control.model.gateway import Gateway
from control.model.gatewayapi import (
    ApiGateway,
    ApiRoute,
    GatewayApiObject,
    GatewayClass,
    ObjectStatus,
    ReferenceGrant,
)
from control.model.traffic import VirtualService
from control.model.types import ConfigWarning, Service, SourceRef


@dataclass(frozen=True, slots=True)
class Translation:
    gateways: tuple[Gateway, ...] = ()
    virtual_services: tuple[VirtualService, ...] = ()
    statuses: tuple[ObjectStatus, ...] = ()
    reference_grants: tuple[ReferenceGrant, ...] = ()
    warnings: tuple[ConfigWarning, ...] = ()


class _Sourced(Protocol):
    @property
    def source(self) -> SourceRef: ...


_S = TypeVar("_S", bound=_Sourced)


def _same(a: _S, b: _S) -> bool:
    # `source` does not take part in equality, but outputs carry it (VirtualServices,
    # warnings): an object moved in its file is translated again.
    return a is b or (a == b and a.source == b.source)


def _same_all(a: tuple[_S, ...], b: tuple[_S, ...]) -> bool:
    return len(a) == len(b) and all(map(_same, a, b))


@dataclass(frozen=True, slots=True)
class _Inputs:
    """What every route's translation reads besides the route (with the namespace labels,
    which the context records as they are asked)."""

    classes: tuple[GatewayClass, ...]
    gateways: tuple[ApiGateway, ...]
    grants: tuple[ReferenceGrant, ...]
    services: tuple[Service, ...]
    secrets: frozenset[tuple[str, str]] | None

    def same(self, other: _Inputs) -> bool:
        return (
            _same_all(self.classes, other.classes)
            and _same_all(self.gateways, other.gateways)
            and _same_all(self.grants, other.grants)
            and self.secrets == other.secrets
            # Identity first (a scan at C speed); else only what backendRefs read.
            and (
                self.services == other.services
                or service_facts(self.services) == service_facts(other.services)
            )
        )


class Translator:
    """Translates one config after another, reusing what the last one made (see the module
    docstring). A call that raises leaves nothing behind: the next one starts afresh."""

    def __init__(self) -> None:
        self._memo: _Memo | None = None

    def translate(
        self,
        objects: Sequence[GatewayApiObject],
        services: Iterable[Service],
        namespace_labels: NamespaceLabels = lambda _ns: (),
        secrets: Collection[tuple[str, str]] | None = None,
    ) -> Translation:
        """Translate every Gateway API object of one config. `namespace_labels` answers a
        namespace's labels (allowedRoutes selectors); `secrets` holds the (namespace, name)
        of every known Secret, or None when they are not known (then certificateRefs are not
        checked for existence)."""
        classes: list[GatewayClass] = []
        gateways: list[ApiGateway] = []
        grant_list: list[ReferenceGrant] = []
        routes: list[ApiRoute] = []
        for o in objects:
            if isinstance(o, ApiRoute):
                routes.append(o)
            elif isinstance(o, ApiGateway):
                gateways.append(o)
            elif isinstance(o, ReferenceGrant):
                grant_list.append(o)
            else:
                classes.append(o)
        grants = tuple(grant_list)
        inputs = _Inputs(
            tuple(classes),
            tuple(gateways),
            grants,
            tuple(services),
            None if secrets is None else frozenset(secrets),
        )
        memo, self._memo = self._memo, None
        if (
            memo is None
            or not memo.inputs.same(inputs)
            or not memo.ctx.labels_still_hold(namespace_labels)
        ):
            ctx = Context(classes, gateways, grants, inputs.services, namespace_labels, secrets)
            memo = _Memo(ctx, inputs)
        memo.inputs = inputs  # equal to what the context was made of; compared from now on
        memo.ctx.namespace_labels = namespace_labels
        result = memo.update(routes)
        self._memo = memo
        return result


def translate(
    objects: Sequence[GatewayApiObject],
    services: Iterable[Service],
    namespace_labels: NamespaceLabels = lambda _ns: (),
    secrets: Collection[tuple[str, str]] | None = None,
) -> Translation:
    """Translate every Gateway API object of one config, from nothing (Translator.translate)."""
    return Translator().translate(objects, services, namespace_labels, secrets)


class _Memo:
    """The last translation against one context: each route's output, the matches every
    route contributes per (Gateway, port, host), and where each VirtualService and status
    sits in the last answer."""

    def __init__(self, ctx: Context, inputs: _Inputs) -> None:
        self.ctx = ctx
        self.inputs = inputs
        self.routes: dict[RouteKey, ApiRoute] = {}
        self.route_list: tuple[ApiRoute, ...] = ()  # as given
        self.route_warnings: list[ConfigWarning] = []  # every route's, in order
        self.outputs: dict[RouteKey, RouteOutput] = {}
        self.order: list[RouteKey] = []  # by route_order
        self.http: dict[HttpKey, dict[RouteKey, tuple[Attached, ...]]] = {}
        self.http_vs: dict[HttpKey, VirtualService] = {}
        self.streams: tuple[VirtualService, ...] = ()
        self.attached: dict[ListenerKey, set[RouteKey]] = {}
        self.gateway_statuses: dict[tuple[str, str], ObjectStatus] = {}
        self.result: Translation | None = None
        self.vs_at: dict[HttpKey, int] = {}
        self.status_at: dict[tuple[str, str, str], int] = {}

    def update(self, routes: Sequence[ApiRoute]) -> Translation:
        old = self.routes
        new, changed, removed = self._diff(routes)
        self.routes, self.route_list = new, tuple(routes)
        if self.result is not None and not changed and not removed:
            return self.result
        # Statuses and VirtualServices keep their positions unless one comes or goes.
        moved = bool(removed) or any(
            k not in old or route_order(old[k]) != route_order(new[k]) for k in changed
        )
        status_moved = moved
        touched: set[HttpKey] = set()
        streams = moved
        warned = False
        for k in changed:
            was = self.outputs.pop(k, None)
            if was is not None:
                self._withdraw(k, was, touched)
            out = self.outputs[k] = translate_route(self.ctx, new[k])
            self._add(k, out, touched)
            streams = streams or bool(out.streams) or (was is not None and bool(was.streams))
            warned = warned or bool(out.warnings) or (was is not None and bool(was.warnings))
            status_moved = status_moved or (was is None or was.status is None) != (
                out.status is None
            )
        for k in removed:
            was = self.outputs.pop(k)
            self._withdraw(k, was, touched)
            warned = warned or bool(was.warnings)
        if moved:
            self.order = sorted(new, key=lambda k: route_order(new[k]))
        if streams:
            self._join_streams()
        if warned or moved:
            self.route_warnings = [w for k in self.order for w in self.outputs[k].warnings]
        virtual_services = self._virtual_services(touched, moved=streams)
        statuses = self._statuses(changed, moved=status_moved)
        warnings = [*self.route_warnings, *self.ctx.warnings]
        self.result = Translation(
            gateways=self.ctx.gateways,
            virtual_services=virtual_services,
            statuses=statuses,
            reference_grants=self.inputs.grants,
            warnings=tuple(dict.fromkeys(warnings)),
        )
        return self.result

    def _diff(
        self, routes: Sequence[ApiRoute]
    ) -> tuple[dict[RouteKey, ApiRoute], list[RouteKey], list[RouteKey]]:
        """The routes by key, the keys of those changed or added, the keys removed."""
        before = self.route_list
        if len(routes) == len(before):
            # A source keeps the objects of what it did not parse again: the positions that
            # differ (an identity scan at C speed) hold the changes, when each holds the same
            # route as before.
            new = dict(self.routes)
            changed: list[RouteKey] = []
            for i in compress(range(len(routes)), map(is_not, routes, before)):
                route, was = routes[i], before[i]
                k = route_key(route)
                if k != route_key(was):
                    break
                new[k] = route
                if not _same(was, route):
                    changed.append(k)
            else:
                return new, changed, []
        new = {route_key(r): r for r in routes}
        if len(new) != len(routes):
            # merge() refuses two objects of one kind, namespace and name before this.
            raise ValueError("two Gateway API routes with the same kind, namespace and name")
        old = self.routes
        changed = [k for k, r in new.items() if (had := old.get(k)) is None or not _same(had, r)]
        return new, changed, [k for k in old if k not in new]

    def _withdraw(self, k: RouteKey, out: RouteOutput, touched: set[HttpKey]) -> None:
        for key, _ in out.http:
            del self.http[key][k]
            touched.add(key)
        for at in out.attached:
            self.attached[at].discard(k)

    def _add(self, k: RouteKey, out: RouteOutput, touched: set[HttpKey]) -> None:
        for key, items in out.http:
            self.http.setdefault(key, {})[k] = items
            touched.add(key)
        for at in out.attached:
            self.attached.setdefault(at, set()).add(k)

    def _join_streams(self) -> None:
        """TLS and TCP VirtualServices of every route in order; of two with one name (a
        namespace and route name that spell another's), the first route's is served."""
        names: set[tuple[str, str]] = set()
        streams: list[VirtualService] = []
        for k in self.order:
            for vs in self.outputs[k].streams:
                if vs.key not in names:
                    names.add(vs.key)
                    streams.append(vs)
        self.streams = tuple(streams)

    def _virtual_services(self, touched: set[HttpKey], moved: bool) -> tuple[VirtualService, ...]:
        """The HTTP VirtualServices of the touched (Gateway, port, host)s made again, the
        others kept; in place when none came or went and the streams stayed."""
        for key in touched:
            contributions = self.http.get(key)
            if not contributions:
                self.http.pop(key, None)
                if self.http_vs.pop(key, None) is not None:
                    moved = True
                continue
            if len(contributions) == 1:
                (items,) = contributions.values()
            else:
                items = tuple(
                    item
                    for k in sorted(contributions, key=lambda k: route_order(self.routes[k]))
                    for item in contributions[k]
                )
            state = self.ctx.states[key[:2]]
            vs = http_virtual_service(key, items, state.ref, state.gateway.source)
            was = self.http_vs.get(key)
            if was is None:
                moved = True
            elif was == vs:
                continue  # the very same object stays (for the index's identity checks)
            self.http_vs[key] = vs
        if not moved and self.result is not None:
            out = list(self.result.virtual_services)
            for key in touched:
                out[self.vs_at[key]] = self.http_vs[key]
            return tuple(out)
        # Sorted by name; two of one name (hosts that spell alike) by where they come from.
        entries: list[tuple[tuple[object, ...], VirtualService, HttpKey | None]] = [
            ((vs.key, 0, key), vs, key) for key, vs in self.http_vs.items()
        ]
        entries.extend(((vs.key, 1, i), vs, None) for i, vs in enumerate(self.streams))
        entries.sort(key=lambda e: e[0])
        self.vs_at = {key: i for i, (_, _, key) in enumerate(entries) if key is not None}
        return tuple(vs for _, vs, _ in entries)

    def _statuses(self, changed: list[RouteKey], moved: bool) -> tuple[ObjectStatus, ...]:
        """Every route's status, each Gateway's (attached routes counted again) and each
        GatewayClass's, by (kind, namespace, name); in place when none came or went."""
        gateways: list[ObjectStatus] = []
        for (namespace, name), state in self.ctx.states.items():
            counts = [
                len(self.attached.get((namespace, name, i), ()))
                for i in range(len(state.listeners))
            ]
            status = gateway_status(state, counts)
            if self.gateway_statuses.get((namespace, name)) != status:
                self.gateway_statuses[(namespace, name)] = status
                gateways.append(status)
        if not moved and self.result is not None:
            out = list(self.result.statuses)
            for k in changed:
                route_status = self.outputs[k].status
                if route_status is not None:
                    out[self.status_at[k]] = route_status
            for status in gateways:
                out[self.status_at[(status.kind, status.namespace, status.name)]] = status
            return tuple(out)
        everything = [
            *self.ctx.class_statuses,
            *(out.status for out in self.outputs.values() if out.status is not None),
            *self.gateway_statuses.values(),
        ]
        everything.sort(key=lambda s: (s.kind, s.namespace, s.name))
        self.status_at = {(s.kind, s.namespace, s.name): i for i, s in enumerate(everything)}
        return tuple(everything)
