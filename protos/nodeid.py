"""Envoy node ids in Istio's form, `type~ip~pod.namespace~namespace.svc.<domain>`: what an
agent writes into its Envoy's bootstrap and its own stream's node, and what the control plane
parses (control/model/proxy.py)."""

from __future__ import annotations


def node_id(proxy_type: str, ip: str, pod_name: str, namespace: str, cluster_domain: str) -> str:
    return f"{proxy_type}~{ip}~{pod_name}.{namespace}~{namespace}.svc.{cluster_domain}"
