"""MeshIndex: one immutable view of config + registered workloads, with the lookups that the
generators need. A new index is built for every push; lookups are memoized inside it, so the
work of answering "which endpoints back this port" is done once per push, not once per proxy.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable

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
    Service,
    ServicePort,
    SidecarScope,
    Workload,
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
        self.services: tuple[Service, ...] = tuple(
            sorted(config.services, key=lambda s: s.hostname)
        )
        self.service_by_host: dict[str, Service] = {s.hostname: s for s in self.services}
        self.workloads: tuple[Workload, ...] = tuple(config.workload_entries) + tuple(registered)
        self._endpoints: dict[tuple[str, int], tuple[Endpoint, ...]] = {}
        self._visible: dict[tuple[str, str, str], tuple[Service, ...]] = {}
        self._selected: dict[str, list[Workload]] = {}
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
        # Inverted index (namespace, label key, label value) -> workloads, so selecting the
        # workloads of a service costs the size of its smallest label bucket, not the mesh.
        self._by_label: dict[tuple[str, str, str], list[Workload]] = {}
        self._by_namespace: dict[str, list[Workload]] = {}
        for wl in self.workloads:
            self._by_namespace.setdefault(wl.namespace, []).append(wl)
            for k, v in wl.labels:
                self._by_label.setdefault((wl.namespace, k, v), []).append(wl)

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
                    mtls=sidecar and self._mtls_on(service.namespace, spec.labels, ep_port),
                )
            )
        for wl in self.workloads_selected_by(service):
            sidecar = wl.has_sidecar or dict(wl.labels).get(TLS_MODE_LABEL) == "istio"
            wl_port = wl.port_for(port)
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
                    mtls=sidecar and self._mtls_on(wl.namespace, wl.labels, wl_port),
                )
            )
        result = tuple(sorted(found, key=lambda e: (e.address, e.port)))
        self._endpoints[key] = result
        return result

    def workloads_selected_by(self, service: Service) -> list[Workload]:
        """Workloads in the service's namespace that its selector (Kubernetes Service) or
        workloadSelector (ServiceEntry) matches, in registration order."""
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

    def _mtls_on(self, namespace: str, labels: Labels, port: int) -> bool:
        # As Istio's EDS does: a sidecar whose own policy disables mTLS on the port is sent
        # plaintext, or the client would talk TLS to a listener that only speaks plaintext.
        return self.peer_policy(namespace, labels).mode_for(port) is not MtlsMode.DISABLE

    def identities(self, service: Service, port: ServicePort) -> tuple[str, ...]:
        """SPIFFE IDs an mTLS client of this service port accepts: those of its mTLS
        endpoints, sorted (the clusters' subject alt names)."""
        return tuple(
            sorted(
                {
                    spiffe_id(self.trust_domain, e.namespace, e.service_account)
                    for e in self.endpoints(service, port)
                    if e.mtls
                }
            )
        )

    def all_identities(self) -> dict[tuple[str, int], tuple[str, ...]]:
        """identities() of every service port: a push compares these between two indexes to
        tell whether clusters (their SANs) changed along with the endpoints."""
        return {(s.hostname, p.port): self.identities(s, p) for s in self.services for p in s.ports}

    def subset_endpoints(
        self, service: Service, port: ServicePort, labels: Labels
    ) -> tuple[Endpoint, ...]:
        """The endpoints of a DestinationRule subset: those whose labels include `labels`."""
        key = (service.hostname, port.port, labels)
        cached = self._subset_endpoints.get(key)
        if cached is None:
            cached = tuple(
                e
                for e in self.endpoints(service, port)
                if workload_selector_matches(labels, e.labels)
            )
            self._subset_endpoints[key] = cached
        return cached

    # --- traffic rules (VirtualService, DestinationRule) -----------------------------------

    def _init_traffic(self, config: MeshConfig) -> None:
        self.virtual_services = tuple(sorted(config.virtual_services, key=lambda v: v.key))
        self.destination_rules = tuple(sorted(config.destination_rules, key=lambda r: r.key))
        self._subset_endpoints: dict[tuple[str, int, Labels], tuple[Endpoint, ...]] = {}
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
