"""Warnings for VirtualServices and DestinationRules that compete or point at nothing.

Each warning names both objects and says which one is used; the choice is the one MeshIndex
makes (control/model/rule_lookup.py: pick_virtual_service, pick_destination_rule), so what the
warning says is what the proxies get.
"""

from __future__ import annotations

from collections.abc import Sequence

from control.model.rule_lookup import pick_destination_rule
from control.model.traffic import DestinationRule, VirtualService
from control.model.types import ConfigWarning, Labels, Service


def virtual_service_conflicts(services: Sequence[VirtualService]) -> list[ConfigWarning]:
    """Two VirtualServices naming the same host: the first by (namespace, name) routes it."""
    owner: dict[str, VirtualService] = {}
    out: list[ConfigWarning] = []
    for vs in sorted(services, key=lambda v: v.key):
        for host in vs.hosts:
            first = owner.setdefault(host, vs)
            if first is vs:
                continue
            out.append(
                ConfigWarning(
                    vs.source,
                    f"host {host} is also routed by {first.source}; only one VirtualService "
                    f"routes a host: {first.namespace}/{first.name} (first by namespace/name) "
                    "is used for it, this one is ignored for that host",
                )
            )
    return out


def destination_rule_conflicts(rules: Sequence[DestinationRule]) -> list[ConfigWarning]:
    """Two DestinationRules for the same host in one namespace (and the same workload
    selector, if any): the first by name applies."""
    owner: dict[tuple[str, str, Labels | None], DestinationRule] = {}
    out: list[ConfigWarning] = []
    for rule in sorted(rules, key=lambda r: r.key):
        first = owner.setdefault((rule.namespace, rule.host, rule.workload_selector), rule)
        if first is rule:
            continue
        out.append(
            ConfigWarning(
                rule.source,
                f"host {rule.host} already has {first.source} in namespace {rule.namespace}; "
                f"{first.namespace}/{first.name} (first by name) is used, this one is ignored",
            )
        )
    return out


def unknown_subsets(
    services: Sequence[VirtualService],
    rules: Sequence[DestinationRule],
    registry: Sequence[Service],
) -> list[ConfigWarning]:
    """Routes to a subset that the DestinationRule in effect (for clients in the
    VirtualService's namespace) does not define. Such a destination keeps its cluster name,
    `outbound|PORT|SUBSET|HOST`, which no cluster has: Envoy answers 503, as with Istio.
    Judged by the rules every client of the namespace sees (those without a selector)."""
    sorted_rules = tuple(
        sorted((r for r in rules if r.workload_selector is None), key=lambda r: r.key)
    )
    namespace_of = {s.hostname: s.namespace for s in registry}
    out: list[ConfigWarning] = []
    for vs in sorted(services, key=lambda v: v.key):
        seen: set[tuple[str, str]] = set()
        destinations = [d for r in vs.http for d in r.destinations]
        destinations += [r.mirror for r in vs.http if r.mirror is not None]
        destinations += [d for r in vs.tcp for d in r.destinations]
        for dest in destinations:
            if not dest.subset or (dest.host, dest.subset) in seen:
                continue
            seen.add((dest.host, dest.subset))
            rule = pick_destination_rule(
                sorted_rules, dest.host, vs.namespace, namespace_of.get(dest.host, vs.namespace)
            )
            if rule is None:
                why = f"no DestinationRule for host {dest.host} defines it"
            elif rule.subset(dest.subset) is None:
                why = f"{rule.source} does not define it"
            else:
                continue
            out.append(
                ConfigWarning(
                    vs.source,
                    f"route to {dest.host} subset {dest.subset!r}: {why}; requests routed "
                    "there get 503 (no such cluster)",
                )
            )
    return out
