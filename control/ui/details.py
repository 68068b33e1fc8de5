"""What the page shows for one node or edge (sans-IO): its numbers from the graph and the
config that applies to it, as the control plane resolves it for the proxies involved:

- a service: its Service/ServiceEntry, the VirtualServices and DestinationRules for its host,
  the workloads it selects;
- a workload: the workloads of that name (connected or declared), the PeerAuthentication
  mode in effect and the PeerAuthentications and AuthorizationPolicies that select it;
- an edge from a workload to a service: the VirtualService and DestinationRule that apply to
  that host for clients in the caller's namespace (exportTo resolved); an edge from a service
  to a workload: the server's policies.

Every config object is named with its file:line and carries its spec as loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from control.model.security_index import peer_applies
from control.model.traffic import DestinationRule, VirtualService
from control.model.types import (
    AuthorizationPolicy,
    Labels,
    MeshConfig,
    MtlsMode,
    PeerPolicy,
    Service,
    SourceRef,
    Workload,
    workload_selector_matches,
)
from control.ui.graph import Graph, node_summary

# Labels a workload's name in Istio's metrics may come from, besides its own name.
_NAME_LABELS = ("service.istio.io/canonical-name", "app.kubernetes.io/name", "app")


class DetailIndex(Protocol):
    """The parts of control/model/index.py's MeshIndex the details read (read-only)."""

    @property
    def workloads(self) -> tuple[Workload, ...]: ...

    def traffic_scope(self, client_namespace: str) -> str: ...

    def virtual_service(self, host: str, scope: str) -> VirtualService | None: ...

    def destination_rule(self, host: str, scope: str) -> DestinationRule | None: ...

    def peer_policy(self, namespace: str, labels: Labels) -> PeerPolicy: ...

    def authorization_policies(
        self, namespace: str, labels: Labels
    ) -> tuple[AuthorizationPolicy, ...]: ...


class DetailError(LookupError):
    """The node or edge is not in the graph and not in the config (→ 404)."""


class _Raw:
    """config.raw by (kind, namespace, name), for the specs."""

    def __init__(self, config: MeshConfig) -> None:
        self.by_key: dict[tuple[str, str, str], Mapping[str, Any]] = {
            (ref.kind, ref.namespace, ref.name): obj for ref, obj in config.raw
        }

    def describe(self, source: SourceRef) -> dict[str, object]:
        raw = self.by_key.get((source.kind, source.namespace, source.name), {})
        return {
            "kind": source.kind,
            "namespace": source.namespace,
            "name": source.name,
            "file": source.file,
            "line": source.line,
            "spec": raw.get("spec"),
        }


def workloads_named(index: DetailIndex, namespace: str, name: str) -> list[Workload]:
    return [
        w
        for w in index.workloads
        if w.namespace == namespace
        and (w.name == name or any(v == name for k, v in w.labels if k in _NAME_LABELS))
    ]


def _services_for(config: MeshConfig, host: str) -> list[Service]:
    return [s for s in config.services if s.hostname == host]


def _virtual_services(config: MeshConfig, host: str) -> list[VirtualService]:
    return [v for v in config.virtual_services if host in v.hosts]


def _destination_rules(config: MeshConfig, host: str) -> list[DestinationRule]:
    return [r for r in config.destination_rules if r.host == host]


def _policies(
    config: MeshConfig, index: DetailIndex, raw: _Raw, namespace: str, labels: Labels
) -> dict[str, object]:
    peer = index.peer_policy(namespace, labels)
    return {
        "mtls_mode": peer.mode.value,
        "port_mtls": {str(port): m.value for port, m in peer.port_modes},
        "strict": peer.mode is MtlsMode.STRICT,
        "peer_authentications": [
            raw.describe(p.source)
            for p in config.peer_authentications
            if peer_applies(p, namespace, labels)
        ],
        "authorization_policies": [
            raw.describe(p.source) for p in index.authorization_policies(namespace, labels)
        ],
    }


def _workload_json(w: Workload) -> dict[str, object]:
    return {
        "name": w.name,
        "namespace": w.namespace,
        "address": w.address,
        "service_account": w.service_account,
        "labels": dict(w.labels),
        "sidecar": w.has_sidecar,
        "source": {"kind": w.source.kind, "file": w.source.file, "line": w.source.line},
    }


def _host_config(config: MeshConfig, index: DetailIndex, raw: _Raw, host: str) -> dict[str, Any]:
    services = _services_for(config, host)
    selected: list[Workload] = []
    for s in services:
        if s.selector is not None:
            selected.extend(
                w
                for w in index.workloads
                if w.namespace == s.namespace and workload_selector_matches(s.selector, w.labels)
            )
    return {
        "services": [raw.describe(s.source) for s in services],
        "virtual_services": [raw.describe(v.source) for v in _virtual_services(config, host)],
        "destination_rules": [raw.describe(r.source) for r in _destination_rules(config, host)],
        "workloads": [_workload_json(w) for w in selected],
    }


def node_detail(
    node_id: str, graph: Graph | None, config: MeshConfig, index: DetailIndex
) -> dict[str, object]:
    raw = _Raw(config)
    node, edges_in, edges_out = node_summary(graph, node_id) if graph else (None, [], [])
    out: dict[str, object] = {
        "id": node_id,
        "node": node,
        "inbound": [e.summary_json() for e in edges_in],
        "outbound": [e.summary_json() for e in edges_out],
    }
    if node_id.startswith("svc:"):
        host = node_id[4:]
        detail = _host_config(config, index, raw, host)
        if node is None and not detail["services"]:
            raise DetailError(f"no service {host!r} in the graph or the config")
        out["config"] = detail
    elif node_id.startswith("wl:"):
        namespace, _, name = node_id[3:].partition("/")
        workloads = workloads_named(index, namespace, name)
        if node is None and not workloads:
            raise DetailError(f"no workload {namespace}/{name} in the graph or the config")
        labels = workloads[0].labels if workloads else ()
        out["config"] = {
            "workloads": [_workload_json(w) for w in workloads],
            **_policies(config, index, raw, namespace, labels),
        }
    elif node is None:
        raise DetailError(f"no node {node_id!r} in the graph")
    return out


def edge_detail(
    edge_id: str, graph: Graph | None, config: MeshConfig, index: DetailIndex
) -> dict[str, object]:
    """`edge_id` is `source>target` (the edge ids of /ui/api/graph)."""
    source, sep, target = edge_id.partition(">")
    if not sep or not source or not target:
        raise DetailError(f"{edge_id!r} is not an edge id (SOURCE>TARGET)")
    raw = _Raw(config)
    edge = graph.edge(edge_id) if graph is not None else None
    out: dict[str, object] = {
        "id": edge_id,
        "source": source,
        "target": target,
        "edge": edge.as_json() if edge is not None else None,
    }
    config_out: dict[str, object] = {}
    if target.startswith("svc:"):
        host = target[4:]
        client_ns = source[3:].partition("/")[0] if source.startswith("wl:") else ""
        scope = index.traffic_scope(client_ns)
        vs = index.virtual_service(host, scope)
        dr = index.destination_rule(host, scope)
        config_out["virtual_service"] = raw.describe(vs.source) if vs is not None else None
        config_out["destination_rule"] = raw.describe(dr.source) if dr is not None else None
        config_out["services"] = [raw.describe(s.source) for s in _services_for(config, host)]
    if target.startswith("wl:"):
        namespace, _, name = target[3:].partition("/")
        workloads = workloads_named(index, namespace, name)
        labels = workloads[0].labels if workloads else ()
        config_out["server"] = _policies(config, index, raw, namespace, labels)
    if edge is None and not config_out.get("services") and "server" not in config_out:
        raise DetailError(f"no edge {edge_id!r} in the graph")
    out["config"] = config_out
    return out
