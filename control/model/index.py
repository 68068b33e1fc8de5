"""MeshIndex: one immutable view of config + registered workloads, with the lookups that the
generators need. A new index is built for every push; lookups are memoized inside it, so the
work of answering "which endpoints back this port" is done once per push, not once per proxy.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable

from control.model.proxy import Proxy
from control.model.types import (
    Endpoint,
    Labels,
    MeshConfig,
    Service,
    ServicePort,
    SidecarScope,
    Workload,
    selector_matches,
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
    ) -> None:
        self.config = config
        self.trust_domain = trust_domain
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
            found.add(
                Endpoint(
                    address=spec.address,
                    port=ep_port,
                    labels=spec.labels,
                    service_account=spec.service_account,
                    namespace=service.namespace,
                    has_sidecar=dict(spec.labels).get("security.istio.io/tlsMode") == "istio",
                    locality=spec.locality,
                    weight=spec.weight,
                )
            )
        for wl in self.workloads_selected_by(service):
            found.add(
                Endpoint(
                    address=wl.address,
                    port=wl.port_for(port),
                    labels=wl.labels,
                    service_account=wl.service_account,
                    namespace=wl.namespace,
                    has_sidecar=wl.has_sidecar
                    or dict(wl.labels).get("security.istio.io/tlsMode") == "istio",
                    locality=wl.locality,
                    weight=wl.weight,
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
