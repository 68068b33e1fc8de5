"""Envoy node ids in Istio's form, `type~ip~pod.namespace~namespace.svc.<domain>`: what an
agent writes into its Envoy's bootstrap and its own stream's node, and what the control plane
parses (control/model/proxy.py); and the node metadata every stream of a workload carries."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class NodeIdentity(Protocol):
    """The workload a node speaks for (the agent's config, an Envoy bootstrap's options)."""

    @property
    def ip(self) -> str: ...
    @property
    def instance_ips(self) -> tuple[str, ...]: ...
    @property
    def pod_name(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def service_account(self) -> str: ...
    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def interception_mode(self) -> str: ...


def node_id(proxy_type: str, ip: str, pod_name: str, namespace: str, cluster_domain: str) -> str:
    return f"{proxy_type}~{ip}~{pod_name}.{namespace}~{namespace}.svc.{cluster_domain}"


def identity_metadata(node: NodeIdentity) -> dict[str, object]:
    """The node metadata keys Istio's agent sends on every stream (Envoy's and its own) and
    the control plane reads to find the workload; each stream adds its own keys."""
    return {
        "NAME": node.pod_name,
        "NAMESPACE": node.namespace,
        "INSTANCE_IPS": ",".join(node.instance_ips or (node.ip,)),
        "SERVICE_ACCOUNT": node.service_account,
        "LABELS": dict(node.labels),
        "INTERCEPTION_MODE": node.interception_mode,
        "CLUSTER_ID": "Kubernetes",
    }
