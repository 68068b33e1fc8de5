"""Workloads registered by connected proxies, through Istio's `WorkloadGroup` auto-registration.

A proxy asks to join a group (node metadata `WORKLOAD_GROUP`, or Istio's `AUTO_REGISTER_GROUP`);
it is admitted only when its stream is authenticated (bearer token or client certificate) as
the group's namespace and service account. What the workload is (labels, ports, service
account) comes from the group's template: node metadata is what a caller claims, not what it
is, so a proxy's own labels may add keys but never change one the group sets. Unauthenticated
streams (the plaintext port) never register anything.

An admitted workload stays while any stream of its proxy is open and is removed `grace`
seconds after the last one closes, so a proxy that reconnects (control-plane restart, network
blip) never flaps out of its services' endpoints. When the groups change (`set_groups`), every
tracked proxy is decided again: a deleted group, or a template whose service account no longer
matches, takes its workloads away; a changed template changes them.

A group with a `probe` gates its members on health, as Istio's auto-registration does: the
member's agent runs the probe (agent/health/) and reports on its own authenticated stream
(a DiscoveryRequest of type `istio.io/health`, control/xds/hooks.py `HealthHook`). A report is
recorded only for the entry of that proxy *and that identity*, and only while it is
admitted: a stream of another identity has an entry of its own (the identity is part of the
key) and can never change this one. Istio's WorkloadEntry starts with its health condition
unset and counts as healthy only once a report says so; so here a member of a probed group is
left out of EDS until its first healthy report, leaves it on an unhealthy one and comes back
on the next healthy one (Istio's default: unhealthy endpoints are not sent, which is right
for Envoy and proxyless gRPC alike). `exec` probes are not run by the agent: they gate
nothing (the loader warns).

The bookkeeping is sans-IO: decisions come from the proxy, the identity, the groups and `now`;
`expire()` is called by a timer in the server adapter. A refusal is logged once per proxy and
reason, and counted through `on_refused`.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from control.ca.identity import Identity, IdentityError
from control.model.proxy import Proxy
from control.model.types import SourceRef, Workload, labels_of
from control.model.workloadgroup import GROUP_ANNOTATION, WorkloadGroup

logger = logging.getLogger(__name__)


class Refusal(enum.StrEnum):
    """Why a proxy that named a group was not registered (the metric's `reason` label)."""

    UNAUTHENTICATED = "unauthenticated"
    NO_GROUP = "group_not_found"
    IDENTITY = "identity_mismatch"


@dataclass(frozen=True, slots=True)
class Refused:
    reason: Refusal
    message: str


# Probe kinds the agent runs; a group whose probe is of another kind (exec) gates nothing.
RUN_PROBE_KINDS = frozenset({"httpGet", "tcpSocket", "grpc"})
# Istio's annotation on a WorkloadEntry whose health is reported by its agent.
HEALTH_CHECK_ANNOTATION = "proxy.istio.io/health-checks-enabled"


@dataclass(frozen=True, slots=True)
class Health:
    """The last health report of a member's agent."""

    healthy: bool
    message: str = ""  # why not, as the agent said
    at: float = 0.0  # wall-clock time of the report (configz)


def gates(group: WorkloadGroup | None) -> bool:
    """Whether members of `group` serve only once their agent reports them healthy."""
    return group is not None and group.probe is not None and group.probe.kind in RUN_PROBE_KINDS


def decide(
    proxy: Proxy, identity: Identity | None, group: WorkloadGroup | None
) -> Workload | Refused:
    """The workload `proxy` registers as a member of `group` (the group its node names, looked
    up in its namespace; None when there is none), or why it may not."""
    named = f"WorkloadGroup {proxy.namespace}/{proxy.workload_group}"
    if identity is None:
        return Refused(
            Refusal.UNAUTHENTICATED,
            f"unauthenticated stream (plaintext port) asked to join {named}: "
            "node metadata is not an identity",
        )
    if group is None:
        return Refused(Refusal.NO_GROUP, f"{named} does not exist")
    if (identity.namespace, identity.service_account) != (group.namespace, group.service_account):
        return Refused(
            Refusal.IDENTITY,
            f"caller {identity} is not {group.namespace}/{group.service_account}, "
            f"the identity of {named}",
        )
    return workload_of(proxy, group)


def workload_of(proxy: Proxy, group: WorkloadGroup) -> Workload:
    """A member of `group` at the proxy's address: the group's template, plus the proxy's own
    labels for keys the group does not set."""
    labels = dict(proxy.labels)
    labels.update(group.labels)
    return Workload(
        name=proxy.pod_name,
        namespace=group.namespace,
        address=proxy.ip,
        labels=labels_of(labels),
        service_account=group.service_account,
        source=SourceRef(
            "WorkloadGroup", group.namespace, group.name, group.source.file, group.source.line
        ),
        ports=group.ports,
        # Peers reach it with mTLS only if its Envoy can terminate mTLS (holds the certs),
        # or its gRPC server can (the certificate provider).
        has_sidecar=proxy.sds and not proxy.is_grpc,
        locality=group.locality,
        weight=group.weight,
        proxyless=proxy.is_grpc and proxy.cert_provider,
    )


def health_condition(health: Health) -> dict[str, str]:
    """Istio's `Healthy` condition of a WorkloadEntry."""
    cond = {
        "type": "Healthy",
        "status": "True" if health.healthy else "False",
        "lastProbeTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(health.at)),
    }
    if health.message:
        cond["message"] = health.message
    return cond


def entry_name(group: str, address: str) -> str:
    """Istio's name for an auto-registered WorkloadEntry: `<group>-<ip>`."""
    return f"{group}-{address.replace(':', '-')}"


_Key = tuple[str, str, Identity | None]  # (proxy ip, proxy id, stream identity)


@dataclass(slots=True)
class _Entry:
    proxy: Proxy
    identity: Identity | None
    streams: int
    closed_at: float | None = None
    workload: Workload | None = None  # None: not admitted (refused, or restored and undecided)
    refusal: str = ""  # the last refusal logged for this entry
    health: Health | None = None  # None: never reported (Istio's unset condition)


class WorkloadRegistry:
    def __init__(
        self, grace: float = 10.0, on_refused: Callable[[Refusal], None] | None = None
    ) -> None:
        self.grace = grace
        self._on_refused = on_refused
        self._groups: dict[tuple[str, str], WorkloadGroup] = {}
        # Every connected proxy that names a group, admitted or not: a refused one is decided
        # again when the groups change (its group may appear), and is dropped when its last
        # stream closes. Proxies that name no group are not tracked.
        self._by_key: dict[_Key, _Entry] = {}
        # Restored entries wait for the next set_groups, even when the groups are the same.
        self._undecided = False
        self.version = 0  # bumped on every change of the workload set

    @staticmethod
    def _key(proxy: Proxy, identity: Identity | None) -> _Key:
        return (proxy.ip, proxy.id, identity)

    def _decide(self, entry: _Entry) -> bool:
        """Decide `entry` against the current groups; returns True when its workload changed.
        A refusal is reported once per entry and reason."""
        p = entry.proxy
        verdict = decide(p, entry.identity, self._groups.get((p.namespace, p.workload_group)))
        if isinstance(verdict, Refused):
            if verdict.message != entry.refusal:
                entry.refusal = verdict.message
                logger.warning("proxy %s (%s) not registered: %s", p.id, p.ip, verdict.message)
                if self._on_refused is not None:
                    self._on_refused(verdict.reason)
            workload = None
        else:
            entry.refusal = ""
            workload = verdict
        if workload == entry.workload:
            return False
        entry.workload = workload
        return True

    def connect(self, proxy: Proxy, identity: Identity | None) -> bool:
        """A stream of `proxy` opened, authenticated as `identity` (None: the plaintext port).
        Returns True when the workload set changed."""
        if not proxy.workload_group or not proxy.auto_register:
            return False
        key = self._key(proxy, identity)
        entry = self._by_key.get(key)
        if entry is None:
            entry = self._by_key[key] = _Entry(proxy, identity, 0)
        entry.streams += 1
        entry.closed_at = None
        entry.proxy = proxy  # the newest stream's node (a reconnect may bring new metadata)
        changed = self._decide(entry)
        if changed:
            self.version += 1
        return changed

    def disconnect(self, proxy: Proxy, identity: Identity | None, now: float) -> None:
        key = self._key(proxy, identity)
        entry = self._by_key.get(key)
        if entry is None:
            return
        entry.streams = max(0, entry.streams - 1)
        if entry.streams == 0:
            if entry.workload is None:
                del self._by_key[key]  # nothing registered: nothing to keep for a reconnect
            else:
                entry.closed_at = now

    def _group_of(self, entry: _Entry) -> WorkloadGroup | None:
        return self._groups.get((entry.proxy.namespace, entry.proxy.workload_group))

    def _serves(self, entry: _Entry) -> bool:
        """Whether an admitted entry's workload is in EDS: yes, unless its group gates on
        health and no report, or an unhealthy one, is the last word."""
        if not gates(self._group_of(entry)):
            return True
        return entry.health is not None and entry.health.healthy

    def report_health(
        self, proxy: Proxy, identity: Identity | None, error: str | None, wall: float
    ) -> bool:
        """A health report (`error` None: healthy) arrived on a stream of `proxy`
        authenticated as `identity`. It counts only for that proxy's own admitted entry
        under that identity, and only when its group has a probe the agent runs. Returns
        True when the served workload set changed."""
        if identity is None:
            return False  # the plaintext port proves nobody
        entry = self._by_key.get(self._key(proxy, identity))
        if entry is None or entry.workload is None or entry.streams == 0:
            return False
        if not gates(self._group_of(entry)):
            return False  # Istio ignores reports for entries without health checks
        before = self._serves(entry)
        old = entry.health
        entry.health = Health(error is None, error or "", wall)
        if old is None or old.healthy != entry.health.healthy:
            logger.info(
                "workload %s (%s) is %s%s",
                entry.workload.name,
                entry.workload.address,
                "healthy" if error is None else "unhealthy",
                f": {error}" if error else "",
            )
        changed = self._serves(entry) != before
        if changed:
            self.version += 1
        return changed

    def set_groups(self, groups: Iterable[WorkloadGroup]) -> bool:
        """The WorkloadGroups of the current config. Every tracked proxy is decided again;
        returns True when the workload set changed."""
        new = {g.key: g for g in groups}
        if new == self._groups and not self._undecided:
            return False  # the same groups decide every entry the same way
        self._groups, self._undecided = new, False
        changed = False
        for key, entry in list(self._by_key.items()):
            changed |= self._decide(entry)
            if entry.workload is None and entry.streams == 0:
                del self._by_key[key]  # a restored entry its group no longer admits
        if changed:
            self.version += 1
        return changed

    def next_expiry(self) -> float | None:
        times = [e.closed_at + self.grace for e in self._by_key.values() if e.closed_at is not None]
        return min(times) if times else None

    def expire(self, now: float) -> list[Workload]:
        """Drop workloads whose last stream closed at least `grace` ago; returns them."""
        gone = [
            k
            for k, e in self._by_key.items()
            if e.closed_at is not None and now - e.closed_at >= self.grace
        ]
        removed = [w for k in gone if (w := self._by_key.pop(k).workload) is not None]
        if removed:
            self.version += 1
        return removed

    def _admitted(self) -> list[tuple[_Entry, Workload]]:
        def order(item: tuple[_Key, _Entry]) -> tuple[str, str, str]:
            ip, pid, identity = item[0]
            return (ip, pid, str(identity))

        return [(e, e.workload) for _, e in sorted(self._by_key.items(), key=order) if e.workload]

    def workloads(self) -> tuple[Workload, ...]:
        """The admitted workloads that serve (see `_serves`): what EDS is built from."""
        return tuple(w for e, w in self._admitted() if self._serves(e))

    def workload_entries(self) -> list[dict[str, Any]]:
        """The registered workloads as Istio WorkloadEntry objects naming their group (for
        /debug/configz), with who registered them in `status`."""
        out: list[dict[str, Any]] = []
        for e, w in self._admitted():
            group = e.proxy.workload_group
            spec: dict[str, Any] = {
                "address": w.address,
                "labels": dict(w.labels),
                "serviceAccount": w.service_account,
            }
            if w.ports:
                spec["ports"] = dict(w.ports)
            if w.locality:
                spec["locality"] = w.locality
            if w.weight:
                spec["weight"] = w.weight
            g = self._groups.get((w.namespace, group))
            annotations = {**dict(g.annotations if g else ()), GROUP_ANNOTATION: group}
            status: dict[str, Any] = {
                "proxy": e.proxy.id,
                "identity": str(e.identity),
                "connected": e.streams > 0,
            }
            if gates(g):
                annotations[HEALTH_CHECK_ANNOTATION] = "true"
                status["serving"] = self._serves(e)
                if e.health is not None:
                    # Istio's condition on the WorkloadEntry (absent until the first report).
                    status["conditions"] = [health_condition(e.health)]
            out.append(
                {
                    "apiVersion": "networking.istio.io/v1",
                    "kind": "WorkloadEntry",
                    "metadata": {
                        "name": entry_name(group, w.address),
                        "namespace": w.namespace,
                        "labels": dict(w.labels),
                        "annotations": annotations,
                    },
                    "spec": spec,
                    "status": status,
                }
            )
        return out

    def snapshot(self) -> list[dict[str, Any]]:
        """The registered workloads as JSON-able entries, so a restarted control plane keeps
        serving their endpoints while their proxies reconnect (no gap in EDS). What is kept
        is what the decision needs (the proxy's node, its group, the identity it proved), not
        the workload: a restored entry is decided again against the groups of the new config."""
        return [
            {
                "proxy": e.proxy.id,
                "type": e.proxy.type,
                "address": e.proxy.ip,
                "pod": e.proxy.pod_name,
                "namespace": e.proxy.namespace,
                "labels": dict(e.proxy.labels),
                "group": e.proxy.workload_group,
                "identity": {
                    "namespace": e.identity.namespace,
                    "serviceAccount": e.identity.service_account,
                },
                "sds": e.proxy.sds,
                "generator": e.proxy.generator,
                "cert_provider": e.proxy.cert_provider,
                # Kept so a restart does not take a healthy member out of EDS until its
                # agent's next report; absent: never reported.
                **({"healthy": e.health.healthy} if e.health is not None else {}),
            }
            for e, _ in self._admitted()
            if e.identity is not None
        ]

    def restore(self, entries: list[dict[str, Any]], now: float) -> int:
        """Load a snapshot: each entry counts as disconnected at `now`, so it is dropped
        after the grace period unless its proxy comes back. Entries are admitted only by the
        next `set_groups` (their group must still exist and still have the identity they
        proved); entries without a group and an identity (an older format, or edited by hand)
        are skipped. Returns how many were loaded."""
        restored = 0
        for item in entries:
            try:
                ident = item["identity"]
                identity = Identity(str(ident["namespace"]), str(ident["serviceAccount"]))
                address = str(item["address"])
                group = str(item["group"])
                proxy = Proxy(
                    id=str(item["proxy"]),
                    type=str(item.get("type", "sidecar")),
                    ip=address,
                    ips=(address,),
                    pod_name=str(item["pod"]),
                    namespace=str(item["namespace"]),
                    labels=labels_of({str(k): str(v) for k, v in item["labels"].items()}),
                    service_account=identity.service_account,
                    generator=str(item.get("generator", "")),
                    workload_group=group,
                    sds=bool(item.get("sds", False)),
                    cert_provider=bool(item.get("cert_provider", False)),
                )
            except (KeyError, TypeError, AttributeError, ValueError, IdentityError):
                continue
            if not group:
                continue
            key = self._key(proxy, identity)
            if key not in self._by_key:
                entry = self._by_key[key] = _Entry(proxy, identity, 0, closed_at=now)
                if isinstance(item.get("healthy"), bool):
                    entry.health = Health(item["healthy"], "restored")
                restored += 1
        self._undecided = self._undecided or restored > 0
        return restored
