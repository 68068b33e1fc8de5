"""TrafficIndex: which VirtualService and which DestinationRule apply to a host, as clients of
one namespace see them (exportTo), and which client namespaces can see them differently from
the rest. Built from the rules alone, so an index derived for a workload-only change shares it
with its parent, memos included.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from control.model.gateway import MESH_GATEWAY
from control.model.rule_lookup import (
    pick_destination_rule,
    pick_selected_rule,
    pick_virtual_service,
    selects,
)
from control.model.traffic import DestinationRule, VirtualService, bound_to
from control.model.types import Labels, MeshConfig, Service

# Between a scope's namespace and the names of the selected DestinationRules (a namespace
# name cannot hold it).
_SELECTED = "#"


def mesh_virtual_services(services: Iterable[VirtualService]) -> list[VirtualService]:
    """What of each VirtualService sidecars see (bound to `mesh`)."""
    return [bound for vs in services if (bound := bound_to(vs, MESH_GATEWAY)) is not None]


class TrafficIndex:
    """Per-host lookups over the snapshot's VirtualServices and DestinationRules."""

    def __init__(self, config: MeshConfig, service_by_host: Mapping[str, Service]) -> None:
        self._service_by_host = service_by_host
        # Sidecars see only what is bound to `mesh` (gateway routes are gateway_index's).
        mesh = mesh_virtual_services(config.virtual_services)
        self.virtual_services = tuple(sorted(mesh, key=lambda v: v.key))
        self.destination_rules = tuple(sorted(config.destination_rules, key=lambda r: r.key))
        # Exact hosts are looked up in a dict; only wildcard objects are scanned per host.
        self._vs_by_host: dict[str, list[VirtualService]] = {}
        self._vs_wild: list[VirtualService] = []
        for vs in self.virtual_services:
            for host in vs.hosts:
                if host.startswith("*"):
                    if not self._vs_wild or self._vs_wild[-1] is not vs:
                        self._vs_wild.append(vs)
                else:
                    self._vs_by_host.setdefault(host, []).append(vs)
        self._dr_by_host: dict[str, list[DestinationRule]] = {}
        self._dr_wild: list[DestinationRule] = []
        # Rules with a workload selector, by namespace: only that namespace's clients with
        # the labels see them (traffic_scope names the ones a client's labels select).
        self._selected: dict[str, list[DestinationRule]] = {}
        for dr in self.destination_rules:
            if dr.workload_selector is not None:
                self._selected.setdefault(dr.namespace, []).append(dr)
            elif dr.host.startswith("*"):
                self._dr_wild.append(dr)
            else:
                self._dr_by_host.setdefault(dr.host, []).append(dr)
        # Namespaces whose clients may see traffic rules differently from everyone else: they
        # hold rules of their own, or rules are exported to them by name.
        self._rule_namespaces: set[str] = set()
        owners = [(v.namespace, v.export_to) for v in self.virtual_services]
        owners += [(r.namespace, r.export_to) for r in self.destination_rules]
        for namespace, exports in owners:
            self._rule_namespaces.add(namespace)
            self._rule_namespaces.update(n for n in exports if n not in ("*", "."))
        self._vs_for: dict[tuple[str, str], VirtualService | None] = {}
        self._dr_for: dict[tuple[str, str], DestinationRule | None] = {}

    def traffic_scope(self, client_namespace: str, labels: Labels = ()) -> str:
        """What traffic rules are resolved for: the client's namespace when it could see them
        differently from other namespaces, else "" (shared by all such clients, so their
        clusters and routes are computed once); `namespace#rule,...` when the client's
        `labels` select DestinationRules of its namespace that have a workload selector."""
        scope = client_namespace if client_namespace in self._rule_namespaces else ""
        selected = self._selected.get(client_namespace)
        if selected and labels:
            have = dict(labels)
            names = [r.name for r in selected if selects(r, have)]
            if names:
                return f"{client_namespace}{_SELECTED}{','.join(names)}"
        return scope

    def virtual_service(self, host: str, scope: str) -> VirtualService | None:
        """The VirtualService routing `host` for clients of `scope` (see traffic_scope)."""
        scope = scope.partition(_SELECTED)[0]
        key = (host, scope)
        if key in self._vs_for:
            return self._vs_for[key]
        candidates = tuple(
            sorted({*self._vs_by_host.get(host, ()), *self._vs_wild}, key=lambda v: v.key)
        )
        found = pick_virtual_service(candidates, host, scope) if candidates else None
        self._vs_for[key] = found
        return found

    def destination_rule(self, host: str, scope: str) -> DestinationRule | None:
        """The DestinationRule for `host` as clients of `scope` see it: one that selects them,
        else the rules without a selector as Istio looks them up."""
        key = (host, scope)
        if key in self._dr_for:
            return self._dr_for[key]
        scope, _, names = scope.partition(_SELECTED)
        if names:
            picked = set(names.split(","))
            rules = tuple(r for r in self._selected.get(scope, ()) if r.name in picked)
            found = pick_selected_rule(rules, host)
            if found is not None:
                self._dr_for[key] = found
                return found
        candidates = (*self._dr_by_host.get(host, ()), *self._dr_wild)
        found = None
        if candidates:
            service = self._service_by_host.get(host)
            found = pick_destination_rule(
                tuple(sorted(candidates, key=lambda r: r.key)),
                host,
                scope,
                service.namespace if service else "",
            )
        self._dr_for[key] = found
        return found
