"""Which pods get a sidecar, as Istio decides (sans-IO):
- never in kube-system / kube-public, never host-network pods, never twice (the pod already
  has the `sidecar.istio.io/status` annotation or an `istio-proxy` container);
- the pod's `sidecar.istio.io/inject` label (or, failing that, annotation) decides first:
  "false" opts out, "true" opts in;
- otherwise the namespace label `istio-injection=enabled` opts the pod in;
- a namespace labelled `istio-injection=disabled` is never injected.

Revisions, as the selectors of Istio's revisioned MutatingWebhookConfigurations: a pod
belongs to the revision its namespace names (`istio.io/rev`; a namespace with an
`istio-injection` label belongs to the default revision), or, in a namespace naming none, the
revision its own `istio.io/rev` label names. An injector started with `--revision R` injects
only pods of revision R (unless they opt out with `sidecar.istio.io/inject=false`); one
without a revision injects only pods of the default revision (no `istio.io/rev`, or
`istio.io/rev=default`), by the rules above. A revision's pods get the label `istio.io/rev=R`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from control.webhook.template import PROXY_CONTAINER

NAMESPACE_LABEL = "istio-injection"
INJECT_KEY = "sidecar.istio.io/inject"
STATUS_ANNOTATION = "sidecar.istio.io/status"
REVISION_LABEL = "istio.io/rev"
DEFAULT_REVISION = "default"
IGNORED_NAMESPACES = frozenset(("kube-system", "kube-public"))


@dataclass(frozen=True, slots=True)
class Decision:
    inject: bool
    reason: str


def pod_revision(
    pod: Mapping[str, Any], namespace_labels: Mapping[str, str] | None
) -> tuple[str, str]:
    """(the revision whose injector the pod belongs to, "" = the default one; what said so:
    "namespace" or "pod" for an istio.io/rev label, "" when no revision label applies)."""
    ns_labels = namespace_labels or {}
    if NAMESPACE_LABEL in ns_labels:
        return "", ""
    if REVISION_LABEL in ns_labels:
        revision, where = str(ns_labels[REVISION_LABEL]), "namespace"
    else:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if REVISION_LABEL not in labels:
            return "", ""
        revision, where = str(labels[REVISION_LABEL]), "pod"
    return ("" if revision == DEFAULT_REVISION else revision), where


def decide(
    pod: Mapping[str, Any], namespace_labels: Mapping[str, str] | None, revision: str = ""
) -> Decision:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    namespace = str(meta.get("namespace") or "")
    ns_labels = namespace_labels or {}
    if namespace in IGNORED_NAMESPACES:
        return Decision(False, f"namespace {namespace} is never injected")
    if spec.get("hostNetwork"):
        return Decision(False, "pod uses the host network")
    annotations = meta.get("annotations") or {}
    containers = [
        c.get("name")
        for c in (*(spec.get("containers") or ()), *(spec.get("initContainers") or ()))
    ]
    if STATUS_ANNOTATION in annotations or PROXY_CONTAINER in containers:
        return Decision(False, "already injected")
    if ns_labels.get(NAMESPACE_LABEL) == "disabled":
        return Decision(False, f"namespace label {NAMESPACE_LABEL}=disabled")
    labels = meta.get("labels") or {}
    asked = labels.get(INJECT_KEY, annotations.get(INJECT_KEY))
    value = str(asked).strip().lower() if asked is not None else ""
    if value in ("false", "n", "no", "off", "0"):
        return Decision(False, f"{INJECT_KEY}={asked} (opt-out)")
    mine = "" if revision == DEFAULT_REVISION else revision
    theirs, where = pod_revision(pod, ns_labels)
    if theirs != mine:
        return Decision(
            False, f"the pod is for revision {theirs or DEFAULT_REVISION}, not this one"
        )
    if where:
        return Decision(True, f"{where} label {REVISION_LABEL}={mine or DEFAULT_REVISION}")
    if value in ("true", "y", "yes", "on", "1"):
        return Decision(True, f"{INJECT_KEY}={asked}")
    if ns_labels.get(NAMESPACE_LABEL) == "enabled":
        return Decision(True, f"namespace label {NAMESPACE_LABEL}=enabled")
    return Decision(False, "neither the pod nor its namespace asks for injection")
