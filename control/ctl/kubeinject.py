"""`pilotfish-ctl kube-inject`: manual sidecar injection, the same patch the webhook makes.

Reads Kubernetes YAML (several documents allowed) and prints it back with the agent injected
into every Pod and every pod template (Deployment, StatefulSet, DaemonSet, ReplicaSet, Job,
CronJob). As with istioctl, manual injection does not look at namespace labels: every pod is
injected unless it opts out (`sidecar.istio.io/inject: "false"`) or already has the sidecar;
with `--revision`, with that revision's settings (as a namespace labelled for it).
Other objects pass through unchanged. Sans-IO apart from reading the template.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from control.webhook.decision import NAMESPACE_LABEL, REVISION_LABEL
from control.webhook.inject import injection_patch
from control.webhook.jsonpatch import apply_patch
from control.webhook.template import SidecarTemplate
from control.webhook.values import InjectionValues

# kind -> where its pod template is
_TEMPLATES: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
_MANUAL = {NAMESPACE_LABEL: "enabled"}


class KubeInjectError(Exception):
    """The input is not Kubernetes YAML, or a pod cannot be injected."""


def inject_documents(
    text: str, template: SidecarTemplate, values: InjectionValues, source: str = "<stdin>"
) -> str:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise KubeInjectError(f"{source}: not YAML: {e}") from None
    out = []
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict) or "kind" not in doc:
            raise KubeInjectError(f"{source}: document {i + 1} is not a Kubernetes object")
        try:
            out.append(inject_object(doc, template, values))
        except ValueError as e:  # InjectionError
            name = (doc.get("metadata") or {}).get("name", "?")
            raise KubeInjectError(f"{source}: {doc['kind']} {name}: {e}") from None
    return "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in out)


def inject_object(
    obj: Mapping[str, Any], template: SidecarTemplate, values: InjectionValues
) -> dict[str, Any]:
    kind = obj.get("kind")
    namespace = str((obj.get("metadata") or {}).get("namespace") or "default")
    if kind == "Pod":
        return _inject_pod(dict(obj), namespace, template, values)
    path = _TEMPLATES.get(str(kind))
    if path is None:
        return dict(obj)
    out = dict(obj)
    parent: dict[str, Any] = out
    for key in path[:-1]:
        child = parent.get(key)
        if not isinstance(child, dict):
            return out
        parent[key] = dict(child)
        parent = parent[key]
    pod_template = parent.get(path[-1])
    if isinstance(pod_template, dict):
        parent[path[-1]] = _inject_pod(pod_template, namespace, template, values)
    return out


def _inject_pod(
    pod: dict[str, Any], namespace: str, template: SidecarTemplate, values: InjectionValues
) -> dict[str, Any]:
    meta = dict(pod.get("metadata") or {})
    had_namespace = "namespace" in meta
    meta.setdefault("namespace", namespace)
    view = {**pod, "metadata": meta, "spec": pod.get("spec") or {}}
    # As if the namespace asked for this injector (the default one, or --revision's).
    manual = {REVISION_LABEL: values.revision} if values.revision else _MANUAL
    _, patch = injection_patch(view, manual, template, values)
    if not patch:
        return pod
    out = apply_patch(view, patch)
    if not had_namespace:
        del out["metadata"]["namespace"]  # print back what was given, plus the sidecar
    return out
