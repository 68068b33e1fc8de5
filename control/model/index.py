"""MeshIndex: one immutable view of config + registered workloads, with the lookups that the
generators need. A new index is made for every push; lookups are memoized inside it, so the
work of answering "which endpoints back this port" is done once per push, not once per proxy.

When only workloads changed since the previous push (the usual case: pods come and go, the
rules stay), `MeshIndex.next()` derives the new index from the previous one instead of building
it afresh: what the rules imply is shared, and only the services that select a changed workload
lose their memoized endpoints. `changed_since()` names those services, so the generators can
redo just their part (see GenContext).
"""

from __future__ import annotations

import fnmatch
import itertools
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from control.model.proxy import Proxy
from control.model.traffic import (
    DestinationRule,
    VirtualService,
    pick_destination_rule,
    pick_virtual_service,
)
from control.model.types import (
    ROOT_NAMESPACE,
    TLS_MODE_LABEL,
    AuthorizationPolicy,
    Endpoint,
    Labels,
    MeshConfig,
    MtlsMode,
    PeerAuthentication,
    PeerPolicy,
    Resolution,
    Service,
    ServicePort,
    SidecarScope,
    Workload,
    proxyless_tls,
    selector_matches,
    spiffe_id,
    workload_selector_matches,
)


class MeshIndex:
    """Read-only lookups over one config snapshot and the workloads registered at that time."""

    def __init__(
        self,
        config: MeshConfig,
        registered: Iterable[Workload] = (),
        *,
        trust_domain: str = "cluster.local",
        version: int = 0,
        outbound_traffic_policy: str = "ALLOW_ANY",
    ) -> None:
        self.config = config
        self.trust_domain = trust_domain
        # Mesh-wide (Istio's meshConfig.outboundTrafficPolicy): where a REDIRECT proxy sends
        # traffic for destinations the mesh does not know; a Sidecar may override it.
        self.outbound_traffic_policy = outbound_traffic_policy
        self.version = version
        # Identifies this index to the one derived from it (next()); a token rather than a
        # reference, so a chain of derived indexes does not keep every ancestor alive.
        self._token = object()
        self._derived_from: object = None
        self._changed: frozenset[str] = frozenset()
        self.services: tuple[Service, ...] = tuple(
            sorted(config.services, key=lambda s: s.hostname)
        )
        self.service_by_host: dict[str, Service] = {s.hostname: s for s in self.services}
        # Memos over the rules alone (services, Sidecars, policies): a derived index shares
        # these dicts with its parent, whose rules are equal.
        self._visible: dict[tuple[str, str, str], tuple[Service, ...]] = {}
        self._sidecars: dict[tuple[str, Labels], SidecarScope | None] = {}
        self._peer: dict[tuple[str, Labels], PeerPolicy] = {}
        self._authz: dict[tuple[str, Labels], tuple[AuthorizationPolicy, ...]] = {}
        self._peer_by_ns: dict[str, list[PeerAuthentication]] = {}
        for pa in sorted(config.peer_authentications, key=lambda p: p.name):
            self._peer_by_ns.setdefault(pa.namespace, []).append(pa)
        self._authz_by_ns: dict[str, list[AuthorizationPolicy]] = {}
        for ap in sorted(config.authorization_policies, key=lambda p: p.name):
            self._authz_by_ns.setdefault(ap.namespace, []).append(ap)
        self._init_traffic(config)
        self._selectors: _SelectorIndex | None = None  # built by the first next()
        # Memos over workloads: a derived index copies them, less the changed services.
        self.workloads: tuple[Workload, ...] = tuple(config.workload_entries) + tuple(registered)
        self._endpoints: dict[tuple[str, int], tuple[Endpoint, ...]] = {}
        self._subset_endpoints: dict[str, dict[tuple[int, Labels], tuple[Endpoint, ...]]] = {}
        self._identities: dict[tuple[str, int], tuple[str, ...]] = {}
        self._selected: dict[str, list[Workload]] = {}
        # Inverted index (namespace, label key, label value) -> workloads, so selecting the
        # workloads of a service costs the size of its smallest label bucket, not the mesh.
        self._by_label: dict[tuple[str, str, str], list[Workload]] = {}
        self._by_namespace: dict[str, list[Workload]] = {}
        for wl in self.workloads:
            self._by_namespace.setdefault(wl.namespace, []).append(wl)
            for k, v in wl.labels:
                self._by_label.setdefault((wl.namespace, k, v), []).append(wl)

    # --- the next push ---------------------------------------------------------------------

    def next(
        self,
        config: MeshConfig,
        registered: Iterable[Workload] = (),
        *,
        trust_domain: str = "cluster.local",
        version: int = 0,
        outbound_traffic_policy: str = "ALLOW_ANY",
    ) -> MeshIndex:
        """The index of a new snapshot: derived from this one when only workloads changed
        (the rules and mesh settings are equal), else built afresh. Either way it answers
        every lookup exactly as `MeshIndex(config, registered, ...)` would."""
        workloads = tuple(config.workload_entries) + tuple(registered)
        if (
            trust_domain == self.trust_domain
            and outbound_traffic_policy == self.outbound_traffic_policy
            and rules_of(config) == rules_of(self.config)
        ):
            removed, added = _difference(self.workloads, workloads)
            # Patching costs per changed workload; past a fraction of the mesh a fresh
            # index is as cheap and simpler to trust.
            if len(removed) + len(added) <= max(64, len(workloads) // 8):
                return self._derive(config, workloads, removed, added, version)
        return MeshIndex(
            config,
            registered,
            trust_domain=trust_domain,
            version=version,
            outbound_traffic_policy=outbound_traffic_policy,
        )

    def changed_since(self, other: MeshIndex) -> frozenset[str] | None:
        """When this index was derived from `other` (next()): the hostnames of the services
        whose endpoints may differ between the two (nothing else can). None when it was not:
        then anything may differ."""
        return self._changed if self._derived_from is other._token else None

    def _derive(
        self,
        config: MeshConfig,
        workloads: tuple[Workload, ...],
        removed: Sequence[Workload],
        added: Sequence[Workload],
        version: int,
    ) -> MeshIndex:
        new = object.__new__(MeshIndex)
        # Everything built from the rules, shared: both indexes have equal rules, so the
        # memos hold the same answers for both (the parent is not used after this anyway).
        new.__dict__.update(self.__dict__)
        new.config = config
        new.version = version
        new.workloads = workloads
        new._token = object()
        new._derived_from = self._token
        if self._selectors is None:
            self._selectors = _SelectorIndex(self.services)
        new._selectors = self._selectors
        changed = {
            s.hostname
            for wl in itertools.chain(removed, added)
            for s in self._selectors.selecting(wl)
        }
        new._changed = frozenset(changed)
        # The workload buckets: copied, and copy-on-write for the buckets that change.
        by_label = dict(self._by_label)
        by_namespace = dict(self._by_namespace)
        copied: set[object] = set()

        def bucket(d: dict[_K, list[Workload]], key: _K) -> list[Workload]:
            b = d.get(key)
            if b is None:
                b = d[key] = []
            elif (id(d), key) not in copied:
                b = d[key] = list(b)
            copied.add((id(d), key))
            return b

        for wl in removed:
            _remove(bucket(by_namespace, wl.namespace), wl)
            for k, v in wl.labels:
                _remove(bucket(by_label, (wl.namespace, k, v)), wl)
        for wl in added:
            bucket(by_namespace, wl.namespace).append(wl)
            for k, v in wl.labels:
                bucket(by_label, (wl.namespace, k, v)).append(wl)
        new._by_label = by_label
        new._by_namespace = by_namespace
        # Workload memos: kept for every service that selects no changed workload.
        new._endpoints = dict(self._endpoints)
        new._identities = dict(self._identities)
        new._subset_endpoints = dict(self._subset_endpoints)
        new._selected = dict(self._selected)
        for host in changed:
            new._selected.pop(host, None)
            new._subset_endpoints.pop(host, None)
            for port in self.service_by_host[host].ports:
                new._endpoints.pop((host, port.port), None)
                new._identities.pop((host, port.port), None)
        return new

    # --- endpoints -------------------------------------------------------------------------

    def endpoints(self, service: Service, port: ServicePort) -> tuple[Endpoint, ...]:
        """Endpoints for one service port, sorted for a deterministic EDS payload."""
        key = (service.hostname, port.port)
        cached = self._endpoints.get(key)
        if cached is not None:
            return cached
        found: set[Endpoint] = set()
        for spec in service.static_endpoints:
            named = dict(spec.ports)
            ep_port = named.get(port.name)
            if ep_port is None:
                ep_port = port.target_port if isinstance(port.target_port, int) else port.port
            sidecar = dict(spec.labels).get(TLS_MODE_LABEL) == "istio"
            mtls, tls_only = self._tls(service.namespace, spec.labels, ep_port, sidecar, False)
            found.add(
                Endpoint(
                    address=spec.address,
                    port=ep_port,
                    labels=spec.labels,
                    service_account=spec.service_account,
                    namespace=service.namespace,
                    has_sidecar=sidecar,
                    locality=spec.locality,
                    weight=spec.weight,
                    mtls=mtls,
                    tls_only=tls_only,
                )
            )
        for wl in self.workloads_selected_by(service):
            sidecar = wl.has_sidecar or dict(wl.labels).get(TLS_MODE_LABEL) == "istio"
            wl_port = wl.port_for(port)
            mtls, tls_only = self._tls(wl.namespace, wl.labels, wl_port, sidecar, wl.proxyless)
            found.add(
                Endpoint(
                    address=wl.address,
                    port=wl_port,
                    labels=wl.labels,
                    service_account=wl.service_account,
                    namespace=wl.namespace,
                    has_sidecar=sidecar,
                    locality=wl.locality,
                    weight=wl.weight,
                    mtls=mtls,
                    tls_only=tls_only,
                )
            )
        result = tuple(sorted(found, key=lambda e: (e.address, e.port)))
        self._endpoints[key] = result
        return result

    def workloads_selected_by(self, service: Service) -> list[Workload]:
        """Workloads in the service's namespace that its selector (Kubernetes Service) or
        workloadSelector (ServiceEntry) matches (in no particular order: a derived index
        patches its buckets; endpoints() sorts)."""
        cached = self._selected.get(service.hostname)
        if cached is not None:
            return cached
        out: list[Workload] = []
        if service.registry == "Kubernetes":
            if service.selector:
                out = self._select(service.namespace, service.selector, selector_matches)
        elif service.workload_selector is not None:
            out = self._select(
                service.namespace, service.workload_selector, workload_selector_matches
            )
        self._selected[service.hostname] = out
        return out

    def _select(
        self, namespace: str, selector: Labels, matches: Callable[[Labels, Labels], bool]
    ) -> list[Workload]:
        if selector:
            buckets = [self._by_label.get((namespace, k, v), []) for k, v in selector]
            candidates = min(buckets, key=len)
        else:
            candidates = self._by_namespace.get(namespace, [])
        return [wl for wl in candidates if matches(selector, wl.labels)]

    def _tls(
        self, namespace: str, labels: Labels, port: int, sidecar: bool, proxyless: bool
    ) -> tuple[bool, bool]:
        """(mtls, tls_only) of an endpoint (see Endpoint). As Istio's EDS does, a sidecar
        whose own policy disables mTLS on the port is sent plaintext, or the client would
        talk TLS to a listener that only speaks plaintext. A proxyless server speaks one of
        the two per port (`proxyless_tls`), and its clients must use that one."""
        if not sidecar and not proxyless:
            return False, False
        mode = self.peer_policy(namespace, labels).mode_for(port)
        if proxyless:
            tls = proxyless_tls(mode, dict(labels).get(TLS_MODE_LABEL) == "istio")
            return tls, tls
        return mode is not MtlsMode.DISABLE, mode is MtlsMode.STRICT

    def identities(self, service: Service, port: ServicePort) -> tuple[str, ...]:
        """SPIFFE IDs an mTLS client of this service port accepts: those of its mTLS
        endpoints, sorted (the clusters' subject alt names)."""
        key = (service.hostname, port.port)
        cached = self._identities.get(key)
        if cached is None:
            cached = tuple(
                sorted(
                    {
                        spiffe_id(self.trust_domain, e.namespace, e.service_account)
                        for e in self.endpoints(service, port)
                        if e.mtls
                    }
                )
            )
            self._identities[key] = cached
        return cached

    def subset_endpoints(
        self, service: Service, port: ServicePort, labels: Labels
    ) -> tuple[Endpoint, ...]:
        """The endpoints of a DestinationRule subset: those whose labels include `labels`."""
        memo = self._subset_endpoints.setdefault(service.hostname, {})
        key = (port.port, labels)
        cached = memo.get(key)
        if cached is None:
            cached = tuple(
                e
                for e in self.endpoints(service, port)
                if workload_selector_matches(labels, e.labels)
            )
            memo[key] = cached
        return cached

    # --- traffic rules (VirtualService, DestinationRule) -----------------------------------

    def _init_traffic(self, config: MeshConfig) -> None:
        self.virtual_services = tuple(sorted(config.virtual_services, key=lambda v: v.key))
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
        for dr in self.destination_rules:
            if dr.host.startswith("*"):
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

    def traffic_scope(self, client_namespace: str) -> str:
        """The namespace that traffic rules are resolved for: the client's own when it could
        see them differently from other namespaces, else "" (shared by all such clients, so
        their clusters and routes are computed once)."""
        return client_namespace if client_namespace in self._rule_namespaces else ""

    def virtual_service(self, host: str, scope: str) -> VirtualService | None:
        """The VirtualService routing `host` for clients of `scope` (see traffic_scope)."""
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
        """The DestinationRule for `host` as clients of `scope` see it."""
        key = (host, scope)
        if key in self._dr_for:
            return self._dr_for[key]
        candidates = (*self._dr_by_host.get(host, ()), *self._dr_wild)
        found = None
        if candidates:
            service = self.service_by_host.get(host)
            found = pick_destination_rule(
                tuple(sorted(candidates, key=lambda r: r.key)),
                host,
                scope,
                service.namespace if service else "",
            )
        self._dr_for[key] = found
        return found

    # --- security policies -----------------------------------------------------------------

    def peer_policy(self, namespace: str, labels: Labels) -> PeerPolicy:
        """The PeerAuthentication in effect for a workload, composed as Istio does: the mode of
        the workload policy (selector matches), else of the namespace policy, else of the
        mesh policy (root namespace, no selector), else PERMISSIVE; `portLevelMtls` comes from
        the workload policy only, an UNSET port taking the workload's mode. When several
        policies compete at one level, the first by name wins (Istio: the oldest)."""
        key = (namespace, labels)
        cached = self._peer.get(key)
        if cached is not None:
            return cached
        mesh = next(
            (p for p in self._peer_by_ns.get(ROOT_NAMESPACE, []) if p.selector is None), None
        )
        ns = next((p for p in self._peer_by_ns.get(namespace, []) if p.selector is None), None)
        workload = None
        if namespace != ROOT_NAMESPACE:
            workload = next(
                (
                    p
                    for p in self._peer_by_ns.get(namespace, [])
                    if p.selector and workload_selector_matches(p.selector, labels)
                ),
                None,
            )
        mode = MtlsMode.PERMISSIVE
        for level in (mesh, ns, workload):
            if level is not None and level.mode is not MtlsMode.UNSET:
                mode = level.mode
        port_modes: tuple[tuple[int, MtlsMode], ...] = ()
        if workload is not None:
            port_modes = tuple(
                (port, mode if m is MtlsMode.UNSET else m) for port, m in workload.port_modes
            )
        result = PeerPolicy(mode, port_modes)
        self._peer[key] = result
        return result

    def authorization_policies(
        self, namespace: str, labels: Labels
    ) -> tuple[AuthorizationPolicy, ...]:
        """AuthorizationPolicies that apply to a workload: those of its namespace and of the
        root namespace whose selector matches its labels (no selector: all of them), ordered
        by (namespace, name) so equal inputs give equal RBAC bytes."""
        key = (namespace, labels)
        cached = self._authz.get(key)
        if cached is not None:
            return cached
        namespaces = sorted({namespace, ROOT_NAMESPACE})
        result = tuple(
            ap
            for ns in namespaces
            for ap in self._authz_by_ns.get(ns, [])
            if ap.selector is None or workload_selector_matches(ap.selector, labels)
        )
        self._authz[key] = result
        return result

    # --- Sidecar scoping -------------------------------------------------------------------

    def sidecar_for(self, proxy: Proxy) -> SidecarScope | None:
        """The Sidecar that applies to a proxy: one with a matching workloadSelector first,
        then the namespace-wide one (no selector), as Istio picks them. Ties go to the oldest
        name in sort order so the result is deterministic."""
        key = (proxy.namespace, proxy.labels)
        if key in self._sidecars:
            return self._sidecars[key]
        candidates = sorted(
            (s for s in self.config.sidecars if s.namespace == proxy.namespace),
            key=lambda s: s.name,
        )
        found = next(
            (
                sc
                for sc in candidates
                if sc.workload_selector
                and workload_selector_matches(sc.workload_selector, proxy.labels)
            ),
            None,
        ) or next((sc for sc in candidates if sc.workload_selector is None), None)
        self._sidecars[key] = found
        return found

    def outbound_policy(self, proxy: Proxy) -> str:
        """ALLOW_ANY or REGISTRY_ONLY for this proxy: its Sidecar's, else the mesh's."""
        sidecar = self.sidecar_for(proxy)
        if sidecar is not None and sidecar.outbound_traffic_policy:
            return sidecar.outbound_traffic_policy
        return self.outbound_traffic_policy

    def services_selecting(self, proxy: Proxy) -> tuple[Service, ...]:
        """Services whose workloads include this proxy (Kubernetes selector or ServiceEntry
        workloadSelector on its labels, in its namespace): its inbound ports in REDIRECT."""
        return tuple(
            s
            for s in self.services
            if s.namespace == proxy.namespace
            and (
                (s.registry == "Kubernetes" and selector_matches(s.selector or (), proxy.labels))
                or (
                    s.registry != "Kubernetes"
                    and s.workload_selector is not None
                    and workload_selector_matches(s.workload_selector, proxy.labels)
                )
            )
        )

    def visible_services(self, proxy: Proxy) -> tuple[Service, ...]:
        """Services a proxy may reach: all of them, or what its Sidecar's egress hosts allow."""
        sidecar = self.sidecar_for(proxy)
        key = (
            proxy.namespace,
            sidecar.namespace if sidecar else "",
            sidecar.name if sidecar else "",
        )
        cached = self._visible.get(key)
        if cached is not None:
            return cached
        if sidecar is None or not sidecar.egress:
            result = self.services
        else:
            hosts = [h for eg in sidecar.egress for h in eg.hosts]
            result = tuple(s for s in self.services if _host_allowed(s, hosts, proxy.namespace))
        self._visible[key] = result
        return result


def _host_allowed(service: Service, hosts: list[str], proxy_namespace: str) -> bool:
    for entry in hosts:
        ns, _, dns = entry.partition("/")
        if not dns:
            ns, dns = "*", ns
        if ns == ".":
            ns = proxy_namespace
        if ns not in ("*", service.namespace):
            continue
        if dns == "*" or fnmatch.fnmatchcase(service.hostname, dns):
            return True
    return False


_K = TypeVar("_K")


def rules_of(config: MeshConfig) -> tuple[object, ...]:
    """The config objects that everything but endpoints is built from: services, Sidecars,
    security policies and traffic rules. Two snapshots with equal rules differ at most in
    their workloads, i.e. in endpoints (and what follows from them: mTLS identities, DNS
    clusters of ServiceEntries that select workloads)."""
    return (
        config.services,
        config.sidecars,
        config.peer_authentications,
        config.authorization_policies,
        config.virtual_services,
        config.destination_rules,
    )


def endpoints_only(old: MeshIndex, new: MeshIndex) -> bool:
    """Whether going from `old` to `new` changes endpoint assignments (EDS) and nothing else,
    as Istio's incremental EDS push decides. Not so when the index was not derived (rules
    changed), when the identities behind a changed service change (its mTLS clusters' SANs),
    when whether its endpoints all require mTLS changes (proxyless clients' clusters), or when
    a changed service is a DNS ServiceEntry that takes its endpoints from workloads (DNS
    clusters carry their endpoints inline, in CDS). Costs the changed services only."""
    changed = new.changed_since(old)
    if changed is None:
        return False
    for host in changed:
        service = new.service_by_host[host]
        if service.resolution is Resolution.DNS and service.workload_selector is not None:
            return False
        for p in service.ports:
            if old.identities(service, p) != new.identities(service, p):
                return False
            if _plaintext_labels(old.endpoints(service, p)) != _plaintext_labels(
                new.endpoints(service, p)
            ):
                return False
    return True


def _plaintext_labels(endpoints: tuple[Endpoint, ...]) -> frozenset[Labels]:
    """What a proxyless client's choice of mTLS for a cluster depends on (CDS, not EDS: gRPC
    has no per-endpoint transport sockets): whether some endpoint of the cluster accepts
    plaintext. For a subset cluster that is whether such an endpoint has the subset's labels,
    so equal sets of label sets here mean equal choices for every cluster of the port."""
    return frozenset(e.labels for e in endpoints if not e.tls_only)


def _difference(
    old: tuple[Workload, ...], new: tuple[Workload, ...]
) -> tuple[Sequence[Workload], Sequence[Workload]]:
    """(removed, added) between two workload lists. Snapshots keep unchanged objects (files
    that did not change are not re-read), so identity tests done in C settle nearly every
    pair; equality is asked only where identity fails. The common head and tail are cut off
    first; in the middle, same-length lists are compared pair by pair (edits in place),
    others as multisets of objects (insertions and removals)."""
    head = _common_prefix(old, new)
    tail = _common_prefix(old[head:][::-1], new[head:][::-1])
    mid_old, mid_new = old[head : len(old) - tail], new[head : len(new) - tail]
    if len(mid_old) == len(mid_new):
        pairs = [
            (a, b)
            for a, b, same in zip(
                mid_old, mid_new, map(operator.is_, mid_old, mid_new), strict=True
            )
            if not same and a != b
        ]
        return [a for a, _ in pairs], [b for _, b in pairs]
    old_ids = {id(w) for w in mid_old}
    new_ids = {id(w) for w in mid_new}
    return (
        [w for w in mid_old if id(w) not in new_ids],
        [w for w in mid_new if id(w) not in old_ids],
    )


def _common_prefix(a: Sequence[Workload], b: Sequence[Workload]) -> int:
    same = list(map(operator.is_, a, b))
    start = 0
    while True:
        try:
            i = same.index(False, start)
        except ValueError:
            return len(same)
        if a[i] != b[i]:
            return i
        start = i + 1


def _remove(bucket: list[Workload], wl: Workload) -> None:
    # By identity first: list.remove compares with ==, which for dataclasses is Python code
    # run against every element before the one sought.
    try:
        i = list(map(operator.is_, bucket, itertools.repeat(wl))).index(True)
    except ValueError:
        bucket.remove(wl)  # an equal object stands for it (see _difference)
        return
    del bucket[i]


class _SelectorIndex:
    """Which services select a workload: services keyed by one label of their selector (all
    of a selector's labels must match, so any one of them narrows the candidates), plus the
    ServiceEntries with an empty workloadSelector (every workload of their namespace)."""

    def __init__(self, services: Iterable[Service]) -> None:
        self._by_label: dict[tuple[str, str, str], list[Service]] = {}
        self._everything: dict[str, list[Service]] = {}
        for s in services:
            if s.registry == "Kubernetes":
                selector = s.selector or None  # no selector, or an empty one: selects nothing
            else:
                selector = s.workload_selector
            if selector is None:
                continue
            if not selector:
                self._everything.setdefault(s.namespace, []).append(s)
            else:
                k, v = selector[0]
                self._by_label.setdefault((s.namespace, k, v), []).append(s)

    def selecting(self, wl: Workload) -> list[Service]:
        found = list(self._everything.get(wl.namespace, ()))
        for k, v in wl.labels:
            for s in self._by_label.get((wl.namespace, k, v), ()):
                if s.registry == "Kubernetes":
                    if selector_matches(s.selector or (), wl.labels):
                        found.append(s)
                elif s.workload_selector is not None and workload_selector_matches(
                    s.workload_selector, wl.labels
                ):
                    found.append(s)
        return found
