"""A Gateway API route's backendRefs as model destinations (sans-IO): which resolve (a
Service of the Kubernetes registry with that port, granted by a ReferenceGrant when in another
namespace) and what is sent where one does not.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from control.model.gatewayapi import (
    GROUP,
    ApiRoute,
    BackendRef,
    ReferenceGrant,
    RouteKind,
    RouteRule,
    reference_granted,
)
from control.model.traffic import Destination
from control.model.types import ConfigWarning, Service

# The host of a backend that does not resolve: `.invalid` (RFC 2606) is never a service.
UNRESOLVED = ".invalid"


def unresolved(dest: Destination) -> bool:
    return dest.host.endswith(UNRESOLVED)


def service_facts(services: Iterable[Service]) -> tuple[tuple[object, ...], ...]:
    """What `Backends` reads of the Services: equal facts resolve every backendRef the same
    (a Service's endpoints, say, are not read)."""
    return tuple(
        (s.namespace, s.name, s.hostname, tuple(p.port for p in s.ports))
        for s in services
        if s.registry == "Kubernetes"
    )


class Backends:
    """Resolves backendRefs against one config's Services and ReferenceGrants."""

    def __init__(self, services: Iterable[Service], grants: tuple[ReferenceGrant, ...]) -> None:
        self.services = {(s.namespace, s.name): s for s in services if s.registry == "Kubernetes"}
        self.grants = grants

    def resolve(self, route: ApiRoute, backend: BackendRef) -> tuple[Destination | None, str, str]:
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

    def destinations(
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
                dest, reason, message = self.resolve(route, backend)
                if dest is None:
                    problems.append((reason, message))
                    if route.kind in (RouteKind.HTTP, RouteKind.GRPC) and backend.weight > 0:
                        host = f"{backend.ref.name}.{backend.ref.namespace}{UNRESOLVED}"
                        dests.append(Destination(host, port=backend.port, weight=backend.weight))
                elif dest.weight > 0:
                    dests.append(dest)
            out.append(tuple(dests))
        return out

    def mirror(
        self, route: ApiRoute, rule: RouteRule, warnings: list[ConfigWarning]
    ) -> tuple[Destination | None, float]:
        """The rule's RequestMirror destination (weight 0) and percent; 100 when none.
        Warnings go to `warnings` (the route's)."""
        if not rule.mirrors:
            return None, 100.0
        if len(rule.mirrors) > 1:
            warnings.append(
                ConfigWarning(route.source, "only the first RequestMirror of a rule is served")
            )
        mirror = rule.mirrors[0]
        dest, _, _ = self.resolve(route, mirror.backend)
        return (None if dest is None else replace(dest, weight=0)), mirror.percent
