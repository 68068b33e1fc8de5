"""Which Kubernetes pods are mesh workloads, and where they run: a running, ready pod with an
IP becomes a Workload (labels, service account, named container ports, sidecar or proxyless,
locality); of a Node only its topology labels are kept (they give its pods' locality).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from control.model.locality import TOPOLOGY_LABELS, locality_from_labels
from control.model.types import TLS_MODE_LABEL, SourceRef, Workload, labels_of

# The `file` of workloads that pods become (they have no file and line of their own).
SOURCE_FILE = "kubernetes"
# Istio marks injected pods with this annotation; its value names the sidecar containers.
SIDECAR_STATUS_ANNOTATION = "sidecar.istio.io/status"
# Istio's annotation naming the injection templates; `grpc-agent` is its proxyless one.
TEMPLATES_ANNOTATION = "inject.istio.io/templates"
GRPC_AGENT_TEMPLATE = "grpc-agent"


def node_topology(node: Mapping[str, Any]) -> Mapping[str, Any]:
    """What is kept of a Node: its name and topology labels (its status, which changes with
    every heartbeat and lists every image it holds, is not)."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    return {
        "metadata": {
            "name": meta.get("name", ""),
            "labels": {k: str(labels[k]) for k in TOPOLOGY_LABELS if k in labels},
        }
    }


def pod_workload(
    pod: Mapping[str, Any], node_labels: Mapping[str, str] | None = None
) -> Workload | None:
    """A running, ready pod with an IP as a workload; None for any other pod. `node_labels`:
    the topology labels of the node it runs on, if known."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    ip = status.get("podIP")
    if not ip or meta.get("deletionTimestamp") or status.get("phase") != "Running":
        return None
    if spec.get("hostNetwork"):
        return None  # shares the node's IP: not a mesh endpoint of its own
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or ()}
    if conditions.get("Ready") != "True":
        return None
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    annotations = meta.get("annotations") or {}
    ports: dict[str, int] = {}
    for container in spec.get("containers") or ():
        for port in container.get("ports") or ():
            if port.get("name") and isinstance(port.get("containerPort"), int):
                ports.setdefault(str(port["name"]), int(port["containerPort"]))
    namespace = str(meta.get("namespace") or "default")
    name = str(meta.get("name") or ip)
    return Workload(
        name=name,
        namespace=namespace,
        address=str(ip),
        labels=labels_of(labels),
        service_account=str(spec.get("serviceAccountName") or "default"),
        source=SourceRef("Pod", namespace, name, SOURCE_FILE, 0),
        ports=tuple(sorted(ports.items())),
        has_sidecar=labels.get(TLS_MODE_LABEL) == "istio"
        or SIDECAR_STATUS_ANNOTATION in annotations,
        # Istio's proxyless injection template: an agent beside a gRPC app, no Envoy.
        proxyless=GRPC_AGENT_TEMPLATE
        in str(annotations.get(TEMPLATES_ANNOTATION, "")).replace(" ", "").split(","),
        # As Istio: the pod's `istio-locality` label, else its node's topology labels (else
        # the pod's own, for clusters whose nodes say nothing).
        locality=locality_from_labels({**labels, **(node_labels or {})}),
    )
