"""Finding the control-plane replicas through the Kubernetes API, for `proxy-status`.

The replicas are the pods of the control-plane Deployment (label selector, default
`app=istiod` in `istio-system`); each running pod with an IP is asked at `<pod IP>:<port>`.
`replica_addresses` is sans-IO; `find_replicas` is the one list call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

from control.kube.client import KubeClient, KubeConfig


def replica_addresses(pods: Iterable[Mapping[str, Any]], port: int) -> list[str]:
    """HOST:PORT of every running, not deleting pod with an IP, sorted by pod name."""
    out = []
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name", ""))):
        status = pod.get("status") or {}
        ip = status.get("podIP")
        if not ip or status.get("phase") != "Running":
            continue
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        out.append(f"[{ip}]:{port}" if ":" in str(ip) else f"{ip}:{port}")
    return out


async def find_replicas(config: KubeConfig, namespace: str, selector: str, port: int) -> list[str]:
    """Raises ApiError / OSError / aiohttp errors; the caller reports them."""
    async with KubeClient(config) as client:
        pods, _ = await client.list_all(
            f"/api/v1/namespaces/{quote(namespace, safe='')}/pods", label_selector=selector
        )
    return replica_addresses(pods, port)
