"""Locality load balancing, as Istio applies it to a client's endpoint assignments.

Which setting applies to a cluster (the DestinationRule's, else the mesh's; `enabled: false`
turns it off), and what it makes of the cluster's endpoints for one client:

- `distribute`: the first rule whose `from` matches the client's locality gives each locality
  group a share (`load_balancing_weight`, with the cluster's locality-weighted balancing on);
  groups no destination matches are left out. A client no rule matches gets every group
  weighted by its endpoints, which is what balancing without localities would do.
- failover (only with outlier detection, or Envoy never sees local endpoints go): priorities
  by how much of the client's locality a group shares (region, zone and subzone: 0; region
  and zone: 1; region: 2; else 3, or 4 for a region other than a `failover` rule's `to`),
  and, with `failoverPriority`, by how many of the listed labels an endpoint shares with the
  client first. Priorities are renumbered 0..N without gaps, as Envoy wants them.

Pure functions: settings, localities and labels in; groups of endpoint keys out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from control.generate.load_assignment import EndpointKey, endpoint_keys
from control.model.locality import split_locality, with_topology_labels
from control.model.proxy import Proxy
from control.model.traffic import LocalityLbSetting, TrafficPolicy
from control.model.types import Endpoint

# One locality group of an assignment: locality, priority, weight (0: none) and endpoints.
Group = tuple[str, int, int, tuple[EndpointKey, ...]]


@dataclass(frozen=True, slots=True)
class ClientPlace:
    """What of a client its assignments depend on under locality load balancing: a memo and
    cache key part (clients alike in it share their assignments)."""

    locality: str
    labels: tuple[tuple[str, str], ...]  # the values of the labels failoverPriority names

    @classmethod
    def of(cls, proxy: Proxy, label_keys: Iterable[str]) -> ClientPlace:
        labels = dict(proxy.labels)
        return cls(proxy.locality, tuple((k, labels.get(k, "")) for k in label_keys))


def label_keys_of(lbs: Iterable[LocalityLb | None]) -> tuple[str, ...] | None:
    """None when no cluster balances by locality; else the client labels their assignments
    depend on (possibly none)."""
    keys: set[str] | None = None
    for lb in lbs:
        if lb is not None:
            keys = (keys or set()) | set(lb.label_keys)
    return None if keys is None else tuple(sorted(keys))


def client_groups(
    lb: LocalityLb, client: ClientPlace, endpoints: tuple[Endpoint, ...]
) -> tuple[Group, ...]:
    """`assignment_groups` for a client as ClientPlace states it."""
    return assignment_groups(lb, client.locality, dict(client.labels), endpoints)


@dataclass(frozen=True, slots=True)
class LocalityLb:
    """What locality load balancing does to one cluster: its setting, and whether failover
    applies (outlier detection is set)."""

    setting: LocalityLbSetting
    failover: bool

    @property
    def weighted(self) -> bool:
        """The cluster balances over localities by weight (Envoy's locality-weighted LB)."""
        return bool(self.setting.distribute)

    @property
    def label_keys(self) -> tuple[str, ...]:
        """The client labels the assignment depends on (`failoverPriority`)."""
        if not self.failover:
            return ()
        return tuple(p.partition("=")[0] for p in self.setting.failover_priority)


def cluster_locality_lb(
    mesh: LocalityLbSetting | None, policy: TrafficPolicy | None
) -> LocalityLb | None:
    """The locality load balancing of a cluster under `policy` (its DestinationRule's merged
    policy, or None), with `mesh` the mesh config's setting; None when it changes nothing."""
    lb = policy.load_balancer if policy is not None else None
    rule = lb.locality if lb is not None else None
    setting = rule if rule is not None else mesh
    if setting is None or setting.enabled is False:
        return None
    failover = policy is not None and policy.outlier_detection is not None
    if not setting.distribute and not failover:
        return None
    return LocalityLb(setting, failover)


def locality_matches(locality: tuple[str, str, str], pattern: str) -> bool:
    """Istio's match of a locality against `region[/zone[/subzone]]`, `*` for any part; a
    part the pattern leaves out matches anything."""
    want = split_locality(pattern)
    if want[0] != "*" and want[0] != locality[0]:
        return False
    return all(w in ("", "*") or w == got for w, got in zip(want[1:], locality[1:], strict=True))


def _locality_priority(client: tuple[str, str, str], group: tuple[str, str, str]) -> int:
    if client[0] != group[0]:
        return 3
    if client[1] != group[1]:
        return 2
    return 0 if client[2] == group[2] else 1


def _label_rank(
    keys: tuple[str, ...],
    pinned: Mapping[str, str],
    client: Mapping[str, str],
    labels: Mapping[str, str],
) -> int:
    """0 when the endpoint has every listed label as the client (or the pinned value); else
    len(keys) - i for the first label i it differs in (the earlier, the lower priority)."""
    for i, key in enumerate(keys):
        want = pinned[key] if key in pinned else client.get(key, "")
        if labels.get(key, "") != want:
            return len(keys) - i
    return 0


def assignment_groups(
    lb: LocalityLb,
    client_locality: str,
    client_labels: Mapping[str, str],
    endpoints: tuple[Endpoint, ...],
) -> tuple[Group, ...]:
    """The locality groups of one cluster's assignment for one client, in a stable order."""
    keys = endpoint_keys(endpoints)
    setting = lb.setting
    ranks = [0] * len(endpoints)
    if lb.label_keys and client_labels:
        pinned = dict(p.partition("=")[::2] for p in setting.failover_priority if "=" in p)
        client = with_topology_labels(client_labels, client_locality)
        ranks = [
            _label_rank(
                lb.label_keys, pinned, client, with_topology_labels(dict(e.labels), e.locality)
            )
            for e in endpoints
        ]
    members: dict[tuple[str, int], list[EndpointKey]] = {}
    for key, rank in zip(keys, ranks, strict=True):
        members.setdefault((key[3], rank), []).append(key)
    here = split_locality(client_locality)
    if setting.distribute:
        weights = _distributed(setting, here, members)
        groups = [
            (locality, 0, weights[(locality, rank)], tuple(sorted(eps)))
            for (locality, rank), eps in members.items()
            if weights.get((locality, rank), 0) > 0
        ]
    else:
        by_locality = not setting.failover_priority or bool(setting.failover)
        raw = {
            group: group[1] * 5
            + (_failover_priority(setting, here, group[0]) if by_locality else 0)
            for group in members
        }
        renumbered = {p: i for i, p in enumerate(sorted(set(raw.values())))}
        groups = [
            (locality, renumbered[raw[(locality, rank)]], 0, tuple(sorted(eps)))
            for (locality, rank), eps in members.items()
        ]
    return tuple(sorted(groups))


def _failover_priority(
    setting: LocalityLbSetting, client: tuple[str, str, str], locality: str
) -> int:
    group = split_locality(locality)
    priority = _locality_priority(client, group)
    if priority == 3:
        for rule in setting.failover:
            if rule.source == client[0]:
                if group[0] != rule.to:
                    priority = 4
                break
    return priority


def _distributed(
    setting: LocalityLbSetting,
    client: tuple[str, str, str],
    members: Mapping[tuple[str, int], list[EndpointKey]],
) -> dict[tuple[str, int], int]:
    """Each group's weight under the first `distribute` rule for the client's locality."""
    own = {group: sum(max(k[2], 1) for k in eps) for group, eps in members.items()}
    rule = next((r for r in setting.distribute if locality_matches(client, r.source)), None)
    if rule is None:
        return own
    weights: dict[tuple[str, int], int] = {}
    left = set(members)
    for pattern, share in rule.to:
        chosen = [g for g in sorted(left) if locality_matches(split_locality(g[0]), pattern)]
        total = sum(own[g] for g in chosen)
        for group in chosen:
            left.discard(group)
            weights[group] = math.ceil(own[group] * share / total)
    return weights
