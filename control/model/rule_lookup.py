"""Which traffic rule applies, as Istio looks it up: the DestinationRule and the VirtualService
for a host as a client of a namespace sees them, and what a host pattern matches. Shared by
MeshIndex (control/model/traffic_index.py) and the conflict warnings of the config merge
(control/config/conflicts.py), so what the warnings say is what proxies get.
"""

from __future__ import annotations

from collections.abc import Mapping

from control.model.traffic import DestinationRule, VirtualService, exported_to


def host_matches(pattern: str, host: str) -> bool:
    """A VirtualService/DestinationRule host against a service hostname: equal, `*`, or a
    `*.suffix` wildcard that the host ends with."""
    if pattern == host or pattern == "*":
        return True
    return pattern.startswith("*.") and host.endswith(pattern[1:])


def _specificity(pattern: str, host: str) -> int:
    # Exact beats any wildcard; a longer wildcard suffix beats a shorter one.
    return 1 << 16 if pattern == host else len(pattern)


def pick_destination_rule(
    rules: tuple[DestinationRule, ...], host: str, client_namespace: str, service_namespace: str
) -> DestinationRule | None:
    """The DestinationRule for `host` as a client in `client_namespace` sees it, as Istio looks
    it up: rules in the client's namespace, then in the service's namespace, then in the root
    namespace; within one namespace the most specific host wins, then the first by name.
    `rules` must be sorted by (namespace, name)."""
    from control.model.types import ROOT_NAMESPACE

    for namespace in dict.fromkeys((client_namespace, service_namespace, ROOT_NAMESPACE)):
        best: DestinationRule | None = None
        for rule in rules:
            if rule.namespace != namespace or not host_matches(rule.host, host):
                continue
            if not exported_to(rule.export_to, rule.namespace, client_namespace):
                continue
            if best is None or _specificity(rule.host, host) > _specificity(best.host, host):
                best = rule
        if best is not None:
            return best
    return None


def selects(rule: DestinationRule, labels: Mapping[str, str]) -> bool:
    """Whether a rule with a workload selector applies to a client with `labels`."""
    return all(labels.get(k) == v for k, v in rule.workload_selector or ())


def pick_selected_rule(rules: tuple[DestinationRule, ...], host: str) -> DestinationRule | None:
    """Among the rules that select a client (one namespace's, sorted by name), the one for
    `host`: the most specific host, then the first by name. Istio prefers such a rule to the
    namespace's rules without a selector."""
    best: DestinationRule | None = None
    for rule in rules:
        if not host_matches(rule.host, host):
            continue
        if best is None or _specificity(rule.host, host) > _specificity(best.host, host):
            best = rule
    return best


def pick_virtual_service(
    services: tuple[VirtualService, ...], host: str, client_namespace: str
) -> VirtualService | None:
    """The VirtualService that routes `host` for a client: one VirtualService per host (Istio
    does not merge them for sidecars). The most specific host wins, then the first by
    (namespace, name). `services` must be sorted by (namespace, name)."""
    best: VirtualService | None = None
    best_rank = -1
    for vs in services:
        if not exported_to(vs.export_to, vs.namespace, client_namespace):
            continue
        rank = max((_specificity(p, host) for p in vs.hosts if host_matches(p, host)), default=-1)
        if rank > best_rank:
            best, best_rank = vs, rank
    return best
