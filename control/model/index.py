"""MeshIndex: one immutable view of config + registered workloads, with the lookups that the
generators need. A new index is built for every push; lookups are memoized inside it, so the
work of answering "which endpoints back this port" is done once per push, not once per proxy.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

from control.model.proxy import Proxy
from control.model.types import (
    Endpoint,
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
        out: list[Workload] = []
        for wl in self.workloads:
            if service.registry == "Kubernetes":
                if wl.namespace != service.namespace or service.selector is None:
                    continue
                if selector_matches(service.selector, wl.labels):
                    out.append(wl)
            elif service.workload_selector is not None:
                if wl.namespace == service.namespace and workload_selector_matches(
                    service.workload_selector, wl.labels
                ):
                    out.append(wl)
        return out

    def services_of_workload(self, workload: Workload) -> list[Service]:
        """Services the workload backs (used for inbound config)."""
        return [s for s in self.services if workload in self.workloads_selected_by(s)]

    # --- Sidecar scoping -------------------------------------------------------------------

    def sidecar_for(self, proxy: Proxy) -> SidecarScope | None:
        """The Sidecar that applies to a proxy: one with a matching workloadSelector first,
        then the namespace-wide one (no selector), as Istio picks them. Ties go to the oldest
        name in sort order so the result is deterministic."""
        candidates = sorted(
            (s for s in self.config.sidecars if s.namespace == proxy.namespace),
            key=lambda s: s.name,
        )
        for sc in candidates:
            if sc.workload_selector and workload_selector_matches(
                sc.workload_selector, proxy.labels
            ):
                return sc
        for sc in candidates:
            if sc.workload_selector is None:
                return sc
        return None

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
