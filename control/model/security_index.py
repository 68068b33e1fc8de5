"""SecurityIndex: which PeerAuthentication mode and which AuthorizationPolicies apply to a
workload (namespace + labels), composed as Istio composes them. Built from the rules alone, so
an index derived for a workload-only change shares it with its parent, memos included.
"""

from __future__ import annotations

from control.model.types import (
    ROOT_NAMESPACE,
    AuthorizationPolicy,
    Labels,
    MeshConfig,
    MtlsMode,
    PeerAuthentication,
    PeerPolicy,
    workload_selector_matches,
)


class SecurityIndex:
    """Per-workload lookups over the snapshot's PeerAuthentications and AuthorizationPolicies."""

    def __init__(self, config: MeshConfig) -> None:
        self._peer: dict[tuple[str, Labels], PeerPolicy] = {}
        self._authz: dict[tuple[str, Labels], tuple[AuthorizationPolicy, ...]] = {}
        self._peer_by_ns: dict[str, list[PeerAuthentication]] = {}
        for pa in sorted(config.peer_authentications, key=lambda p: p.name):
            self._peer_by_ns.setdefault(pa.namespace, []).append(pa)
        self._authz_by_ns: dict[str, list[AuthorizationPolicy]] = {}
        for ap in sorted(config.authorization_policies, key=lambda p: p.name):
            self._authz_by_ns.setdefault(ap.namespace, []).append(ap)

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
        in_namespace = self._peer_by_ns.get(namespace, [])
        ns = next((p for p in in_namespace if p.selector is None), None)
        workload = next(
            (p for p in in_namespace if p.selector and peer_applies(p, namespace, labels)), None
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


def peer_applies(policy: PeerAuthentication, namespace: str, labels: Labels) -> bool:
    """Whether a PeerAuthentication takes part in a workload's mode: mesh-wide,
    namespace-wide, or of the workload's namespace and selecting it (a selector in the root
    namespace selects nothing, as in Istio)."""
    if policy.selector is None:
        return policy.namespace in (ROOT_NAMESPACE, namespace)
    return (
        bool(policy.selector)
        and policy.namespace == namespace != ROOT_NAMESPACE
        and workload_selector_matches(policy.selector, labels)
    )
