"""VisibilityIndex: which Sidecar scopes a proxy, what it may reach through it (egress hosts,
outbound traffic policy) and which services select the proxy itself (its inbound ports in
REDIRECT). Built from the rules alone, so an index derived for a workload-only change shares
it with its parent, memos included.
"""

from __future__ import annotations

import fnmatch

from control.model.proxy import Proxy
from control.model.types import (
    Labels,
    Service,
    SidecarScope,
    selector_matches,
    workload_selector_matches,
)


class VisibilityIndex:
    """Per-proxy lookups over the snapshot's Sidecars and services."""

    def __init__(
        self,
        sidecars: tuple[SidecarScope, ...],
        services: tuple[Service, ...],
        outbound_traffic_policy: str,
    ) -> None:
        self._sidecars_by_ns: dict[str, list[SidecarScope]] = {}
        for sc in sorted(sidecars, key=lambda s: s.name):
            self._sidecars_by_ns.setdefault(sc.namespace, []).append(sc)
        self._services = services
        # Mesh-wide (Istio's meshConfig.outboundTrafficPolicy): where a REDIRECT proxy sends
        # traffic for destinations the mesh does not know; a Sidecar may override it.
        self._outbound_traffic_policy = outbound_traffic_policy
        self._sidecars: dict[tuple[str, Labels], SidecarScope | None] = {}
        self._visible: dict[tuple[str, str, str], tuple[Service, ...]] = {}
        # The same by what picks the Sidecar: asked for every stream on every push, so one
        # lookup instead of finding the Sidecar first.
        self._visible_for: dict[tuple[str, str, Labels], tuple[Service, ...]] = {}

    def sidecar_for(self, proxy: Proxy) -> SidecarScope | None:
        """The Sidecar that applies to a proxy: one with a matching workloadSelector first,
        then the namespace-wide one (no selector), as Istio picks them. Ties go to the oldest
        name in sort order so the result is deterministic. A router has none: Sidecars
        configure sidecars (an Istio gateway sees every service exported to it)."""
        if proxy.is_router:
            return None
        key = (proxy.namespace, proxy.labels)
        if key in self._sidecars:
            return self._sidecars[key]
        candidates = self._sidecars_by_ns.get(proxy.namespace, [])
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
        return self._outbound_traffic_policy

    def services_selecting(self, proxy: Proxy) -> tuple[Service, ...]:
        """Services whose workloads include this proxy (Kubernetes selector or ServiceEntry
        workloadSelector on its labels, in its namespace): its inbound ports in REDIRECT."""
        return tuple(
            s
            for s in self._services
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
        of_proxy = visibility_class(proxy)
        found = self._visible_for.get(of_proxy)
        if found is not None:
            return found
        found = self._visible_for[of_proxy] = self._visible_services(proxy)
        return found

    def _visible_services(self, proxy: Proxy) -> tuple[Service, ...]:
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
            result = self._services
        else:
            hosts = [h for eg in sidecar.egress for h in eg.hosts]
            result = tuple(s for s in self._services if _host_allowed(s, hosts, proxy.namespace))
        self._visible[key] = result
        return result


def visibility_class(proxy: Proxy) -> tuple[str, str, Labels]:
    """What of a proxy picks its Sidecar and so its visible services: proxies alike in these
    see the same services (and, the namespace being part of it, share a traffic scope)."""
    return (proxy.type, proxy.namespace, proxy.labels)


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
