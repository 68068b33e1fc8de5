"""EndpointIndex: which endpoints back each service port (with their mTLS settings), which
SPIFFE identities they present, and which endpoints form a DestinationRule subset. It is the
only part of a MeshIndex that depends on workloads, so it is also where a new index is patched
instead of rebuilt when only workloads changed (`derive`), at a cost per changed workload.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

from control.model.security_index import SecurityIndex
from control.model.types import (
    TLS_MODE_LABEL,
    Endpoint,
    Labels,
    MtlsMode,
    Service,
    ServicePort,
    Workload,
    WorkloadEndpointSpec,
    proxyless_tls,
    selector_matches,
    spiffe_id,
    workload_selector_matches,
)

_K = TypeVar("_K")


class EndpointIndex:
    """Memoized endpoint lookups over one list of workloads and the services selecting them."""

    def __init__(
        self,
        services: tuple[Service, ...],
        service_by_host: Mapping[str, Service],
        workloads: tuple[Workload, ...],
        *,
        security: SecurityIndex,
        trust_domain: str,
    ) -> None:
        self._selectors: _SelectorIndex | None = None  # built by the first derive()
        self._services = services
        self._service_by_host = service_by_host
        self._security = security
        self._trust_domain = trust_domain
        self.workloads = workloads
        self._endpoints: dict[tuple[str, int], tuple[Endpoint, ...]] = {}
        self._subset_endpoints: dict[str, dict[tuple[int, Labels], tuple[Endpoint, ...]]] = {}
        self._identities: dict[tuple[str, int], tuple[str, ...]] = {}
        self._selected: dict[str, list[Workload]] = {}
        # Inverted index (namespace, label key, label value) -> workloads, so selecting the
        # workloads of a service costs the size of its smallest label bucket, not the mesh.
        self._by_label: dict[tuple[str, str, str], list[Workload]] = {}
        self._by_namespace: dict[str, list[Workload]] = {}
        for wl in workloads:
            self._by_namespace.setdefault(wl.namespace, []).append(wl)
            for k, v in wl.labels:
                self._by_label.setdefault((wl.namespace, k, v), []).append(wl)

    def derive(
        self,
        workloads: tuple[Workload, ...],
        removed: Sequence[Workload],
        added: Sequence[Workload],
    ) -> tuple[EndpointIndex, frozenset[str]]:
        """The index of `workloads` (this one's, less `removed`, plus `added`) under the same
        services and policies, and the hostnames of the services whose answers may differ
        between the two. Memos of every other service are carried over."""
        new = object.__new__(EndpointIndex)
        new.__dict__.update(self.__dict__)
        new.workloads = workloads
        if self._selectors is None:
            self._selectors = _SelectorIndex(self._services)
        new._selectors = self._selectors
        changed = {
            s.hostname
            for wl in itertools.chain(removed, added)
            for s in self._selectors.selecting(wl)
        }
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
            for port in self._service_by_host[host].ports:
                new._endpoints.pop((host, port.port), None)
                new._identities.pop((host, port.port), None)
        return new, frozenset(changed)

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
            found.add(self._endpoint(spec, service.namespace, ep_port, sidecar, False))
        for wl in self.workloads_selected_by(service):
            sidecar = wl.has_sidecar or dict(wl.labels).get(TLS_MODE_LABEL) == "istio"
            found.add(self._endpoint(wl, wl.namespace, wl.port_for(port), sidecar, wl.proxyless))
        result = tuple(sorted(found, key=lambda e: (e.address, e.port)))
        self._endpoints[key] = result
        return result

    def _endpoint(
        self,
        source: WorkloadEndpointSpec | Workload,
        namespace: str,
        port: int,
        sidecar: bool,
        proxyless: bool,
    ) -> Endpoint:
        mtls, tls_only = self._tls(namespace, source.labels, port, sidecar, proxyless)
        return Endpoint(
            address=source.address,
            port=port,
            labels=source.labels,
            service_account=source.service_account,
            namespace=namespace,
            has_sidecar=sidecar,
            locality=source.locality,
            weight=source.weight,
            mtls=mtls,
            tls_only=tls_only,
        )

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
        mode = self._security.peer_policy(namespace, labels).mode_for(port)
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
                        spiffe_id(self._trust_domain, e.namespace, e.service_account)
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


def workload_difference(
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
        bucket.remove(wl)  # an equal object stands for it (see workload_difference)
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
