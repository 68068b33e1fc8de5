"""Sidecar injection as a pure function: (pod, namespace labels, template, values) in, a JSON
patch (RFC 6902) out. The admission webhook and `pilotfish-ctl kube-inject` both use it; no I/O.

What it adds: the template's agent container (with the pod's labels as ISTIO_META_LABELS), its
volumes, the status annotation and the `security.istio.io/tlsMode: istio` label (auto mTLS
knows the pod has a sidecar). When the pod asks for interception mode REDIRECT (annotation
`sidecar.istio.io/interceptionMode`), also the capture init container, first, with args from
Istio's `traffic.sidecar.istio.io/*` annotations.

Who gets one: control/webhook/decision.py. What the pod's annotations ask (mode, capture,
start order, scrape annotations) and the per-mesh values: control/webhook/values.py. App
probes are rewritten to go through the agent (control/webhook/probes.py).

A pod whose `inject.istio.io/templates` annotation names Istio's `gateway` template gets the
agent as a router (`--proxy-type router`): no capture (a gateway is addressed, not
intercepted) and node metadata INTERCEPTION_MODE REDIRECT, as Istio's gateways have, so its
listeners bind every address of the pod.

Start order, as Istio's template: with `holdApplicationUntilProxyStarts` (the mesh default in
`InjectionValues`, or the pod's `proxy.istio.io/config` annotation) the agent container goes
first and gets a postStart hook `pilotfish-agent wait`; kubelet starts containers in order and
the next one only once the previous one's postStart hook returned, so the app starts with the
proxy ready. With native sidecars (`InjectionValues.native_sidecars`, Istio's
ENABLE_NATIVE_SIDECARS, or the pod's `sidecar.istio.io/nativeSidecar` annotation) the agent is
an init container with `restartPolicy: Always` instead: Kubernetes itself holds the later
containers until its startupProbe passes, so no hook is needed (Istio adds none then).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from control.webhook.decision import (
    DEFAULT_REVISION,
    REVISION_LABEL,
    STATUS_ANNOTATION,
    Decision,
    decide,
)
from control.webhook.jsonpatch import append, set_key, set_keys
from control.webhook.probes import (
    PROBERS_ENV,
    ProbeRewriteError,
    probers_env,
    rewrite_probes,
    rewrite_wanted,
)
from control.webhook.template import PROXY_CONTAINER, SidecarTemplate
from control.webhook.values import (
    GATEWAY_TEMPLATE,
    InjectionError,
    InjectionValues,
    capture_args,
    hold_application,
    interception_mode,
    native_sidecars,
    pilot_address,
    prometheus_annotations,
    templates,
)

TLS_MODE_LABEL = "security.istio.io/tlsMode"
# Istio's is `pilot-agent wait`; ours polls the agent's status port (agent/wait.py).
WAIT_COMMAND = ("pilotfish-agent", "wait")
# Istio's sidecar startupProbe: what a native sidecar's start is judged by (kubelet starts the
# next container once it passes). Used when the template's container has none.
_STARTUP_PROBE: dict[str, Any] = {
    "httpGet": {"path": "/healthz/ready", "port": 15021},
    "initialDelaySeconds": 0,
    "periodSeconds": 1,
    "timeoutSeconds": 3,
    "failureThreshold": 600,
}


def injection_patch(
    pod: Mapping[str, Any],
    namespace_labels: Mapping[str, str] | None,
    template: SidecarTemplate,
    values: InjectionValues = InjectionValues(),
) -> tuple[Decision, list[dict[str, Any]]]:
    """The decision and the JSON patch ([] when the pod is not injected). Raises
    InjectionError when the pod asks for injection but cannot get it."""
    decision = decide(pod, namespace_labels, values.revision)
    if not decision.inject:
        return decision, []
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    gateway = GATEWAY_TEMPLATE in templates(pod)
    mode = "REDIRECT" if gateway else interception_mode(pod)
    scrape = prometheus_annotations(meta.get("annotations") or {}, values)
    try:
        probe_changes, probers = (
            rewrite_probes(spec.get("containers") or ())
            if rewrite_wanted(meta.get("annotations") or {}, values.rewrite_app_probes)
            else ([], {})
        )
    except ProbeRewriteError as e:
        raise InjectionError(str(e)) from None
    native = native_sidecars(pod, values)
    hold = hold_application(pod, values) and not native
    init_containers, containers, volumes = template.copy()
    if mode != "REDIRECT" or gateway:
        init_containers = []
    else:
        extra = capture_args(meta.get("annotations") or {})
        for c in init_containers:
            c["args"] = [*(c.get("args") or ()), *extra]
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    labels[TLS_MODE_LABEL] = "istio"
    if values.revision:
        labels[REVISION_LABEL] = values.revision
    for c in (*init_containers, *containers):
        if values.image:
            c["image"] = values.image
    for c in containers:
        if c["name"] != PROXY_CONTAINER:
            continue
        env = list(c.get("env") or ())
        env = _set_env(
            env, "ISTIO_META_LABELS", ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        )
        if values.pilot_address or values.revision:
            env = _set_env(env, "PILOT_ADDRESS", pilot_address(values))
        if mode == "REDIRECT":
            env = _set_env(env, "ISTIO_META_INTERCEPTION_MODE", "REDIRECT")
        for name, value in values.proxy_metadata:
            env = _set_env(env, name, value)
        if values.drain_duration is not None:
            env = _set_env(env, "PILOTFISH_DRAIN_DURATION", f"{values.drain_duration:g}")
        if probers:
            env = _set_env(env, PROBERS_ENV, probers_env(probers))
        c["env"] = env
        if gateway:
            c["args"] = [*(c.get("args") or ()), "--proxy-type", "router"]
    first: list[dict[str, Any]] = []
    if native:
        # Between the capture init container and the pod's own ones, as Istio orders them:
        # the pod's init containers then start with the proxy running and ready.
        for c in containers:
            if c["name"] == PROXY_CONTAINER:
                c["restartPolicy"] = "Always"
                c.setdefault("startupProbe", copy.deepcopy(_STARTUP_PROBE))
        init_containers += [c for c in containers if c["name"] == PROXY_CONTAINER]
        containers = [c for c in containers if c["name"] != PROXY_CONTAINER]
    elif hold:
        for c in containers:
            if c["name"] == PROXY_CONTAINER:
                lifecycle = dict(c.get("lifecycle") or {})
                lifecycle["postStart"] = {"exec": {"command": list(WAIT_COMMAND)}}
                c["lifecycle"] = lifecycle
        first = [c for c in containers if c["name"] == PROXY_CONTAINER]
        containers = [c for c in containers if c["name"] != PROXY_CONTAINER]
    _check_clashes(
        "container",
        spec,
        ("containers", "initContainers"),
        [*first, *containers, *init_containers],
    )
    _check_clashes("volume", spec, ("volumes",), volumes)

    # Probes first: their paths index the pod's containers before any is inserted.
    patch: list[dict[str, Any]] = [
        {"op": "add", "path": f"/spec/containers/{index}/{field}", "value": probe}
        for index, field, probe in probe_changes
    ]
    if init_containers:
        if spec.get("initContainers"):
            # Capture first, as Istio does: the pod's own init containers then already run
            # with its traffic captured, exactly as the app will.
            for c in reversed(init_containers):
                patch.append({"op": "add", "path": "/spec/initContainers/0", "value": c})
        else:
            patch.append({"op": "add", "path": "/spec/initContainers", "value": init_containers})
    if first and spec.get("containers"):
        # Index 0: kubelet starts containers in list order, so this one's postStart hook
        # holds back every app container.
        for c in reversed(first):
            patch.append({"op": "add", "path": "/spec/containers/0", "value": c})
        patch += append("/spec/containers", spec.get("containers"), containers)
    else:
        patch += append("/spec/containers", spec.get("containers"), [*first, *containers])
    patch += append("/spec/volumes", spec.get("volumes"), volumes)
    status: dict[str, Any] = {
        "initContainers": [c["name"] for c in init_containers],
        "containers": [c["name"] for c in (*first, *containers)],
        "volumes": [v["name"] for v in volumes],
        "revision": values.revision or DEFAULT_REVISION,
    }
    patch += set_keys(
        "/metadata/annotations",
        meta.get("annotations"),
        {STATUS_ANNOTATION: json.dumps(status, separators=(",", ":")), **scrape},
    )
    patch += set_key("/metadata/labels", meta.get("labels"), TLS_MODE_LABEL, "istio")
    if values.revision:
        # As Istio's template: which revision's proxy the pod runs (what `istioctl
        # proxy-status` and a canary's rollout look at).
        patch += set_key(
            "/metadata/labels", {TLS_MODE_LABEL: "istio"}, REVISION_LABEL, values.revision
        )
    return decision, patch


def _set_env(env: list[dict[str, Any]], name: str, value: str) -> list[dict[str, Any]]:
    kept = [e for e in env if e.get("name") != name]
    return [*kept, {"name": name, "value": value}]


def _check_clashes(
    what: str, spec: Mapping[str, Any], keys: Sequence[str], added: Sequence[Mapping[str, Any]]
) -> None:
    have = {str(x.get("name")) for k in keys for x in spec.get(k) or ()}
    clash = sorted(have & {str(a["name"]) for a in added})
    if clash:
        raise InjectionError(f"the pod already has a {what} named {', '.join(clash)}")
