"""Sidecar injection as a pure function: (pod, namespace labels, template, values) in, a JSON
patch (RFC 6902) out. The admission webhook and `pilotfish-ctl kube-inject` both use it; no I/O.

Who gets a sidecar follows Istio:
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

App probes are rewritten to go through the agent (control/webhook/probes.py).

What it adds: the template's agent container (with the pod's labels as ISTIO_META_LABELS), its
volumes, the status annotation and the `security.istio.io/tlsMode: istio` label (auto mTLS
knows the pod has a sidecar). When the pod asks for interception mode REDIRECT (annotation
`sidecar.istio.io/interceptionMode`), also the capture init container, first, with args from
Istio's `traffic.sidecar.istio.io/*` annotations.

Prometheus, as Istio's metrics merge: the pod gets `prometheus.io/scrape: "true"`,
`prometheus.io/port: "15020"` and `prometheus.io/path: /stats/prometheus` (the agent's merged
metrics), unless it opts out (`prometheus.io/scrape: "false"`, or
`prometheus.istio.io/merge-metrics: "false"`, or `InjectionValues.prometheus_merge` off: mesh
`enablePrometheusMerge`) or already names its own scrape port or path: Istio then moves those
into ISTIO_PROMETHEUS_ANNOTATIONS for its agent to scrape and merge, which our agent does not
do, so the pod's own annotations are kept and nothing of the app's metrics is lost.

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
import ipaddress
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from control.webhook.probes import (
    PROBERS_ENV,
    ProbeRewriteError,
    probers_env,
    rewrite_probes,
    rewrite_wanted,
)
from control.webhook.template import PROXY_CONTAINER, SidecarTemplate

NAMESPACE_LABEL = "istio-injection"
INJECT_KEY = "sidecar.istio.io/inject"
STATUS_ANNOTATION = "sidecar.istio.io/status"
INTERCEPTION_ANNOTATION = "sidecar.istio.io/interceptionMode"
TLS_MODE_LABEL = "security.istio.io/tlsMode"
REVISION_LABEL = "istio.io/rev"
DEFAULT_REVISION = "default"
IGNORED_NAMESPACES = frozenset(("kube-system", "kube-public"))
INTERCEPTION_MODES = ("NONE", "REDIRECT")
PROXY_CONFIG_ANNOTATION = "proxy.istio.io/config"
NATIVE_SIDECAR_ANNOTATION = "sidecar.istio.io/nativeSidecar"
HOLD_KEY = "holdApplicationUntilProxyStarts"
TEMPLATES_ANNOTATION = "inject.istio.io/templates"
GATEWAY_TEMPLATE = "gateway"
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

# Istio's capture annotations -> `pilotfish-agent iptables` flags, and how to check the value.
_CAPTURE = "traffic.sidecar.istio.io/"
_CAPTURE_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("includeOutboundIPRanges", "--include-outbound-ip-ranges", "cidrs*"),
    ("excludeOutboundIPRanges", "--exclude-outbound-ip-ranges", "cidrs"),
    ("includeInboundPorts", "--include-inbound-ports", "ports*"),
    ("excludeInboundPorts", "--exclude-inbound-ports", "ports"),
    ("excludeOutboundPorts", "--exclude-outbound-ports", "ports"),
)
# The agent's own inbound ports are never captured; Istio adds the annotation's ports to
# these rather than replacing them (same list as agent/capture/rules.py, which control may
# not import).
_ALWAYS_EXCLUDED_INBOUND = ("15000", "15020", "15021", "15090")


# What Prometheus scrapes on an injected pod: the agent's status port, merged metrics.
PROMETHEUS_ANNOTATIONS = {
    "prometheus.io/scrape": "true",
    "prometheus.io/port": "15020",
    "prometheus.io/path": "/stats/prometheus",
}
MERGE_METRICS_ANNOTATION = "prometheus.istio.io/merge-metrics"
# Prometheus sanitizes annotation names into label names, so `prometheus.io/scrape` and
# `prometheus-io/scrape` mean the same to it (and to Istio's injector).
_LABEL_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")
_GO_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_GO_FALSE = ("0", "f", "F", "FALSE", "false", "False")


class InjectionError(ValueError):
    """The pod cannot be injected as asked (a bad annotation value, a name clash)."""


@dataclass(frozen=True, slots=True)
class InjectionValues:
    """Per-mesh values put into the template; empty means "as the template says"."""

    image: str = ""
    pilot_address: str = ""
    # MeshConfig defaultConfig.holdApplicationUntilProxyStarts: the default for pods whose
    # proxy.istio.io/config annotation does not say.
    hold_application_until_proxy_starts: bool = False
    # Istio's ENABLE_NATIVE_SIDECARS: the default for pods without the annotation.
    native_sidecars: bool = False
    # MeshConfig enablePrometheusMerge (Istio's default: on): scrape annotations added.
    prometheus_merge: bool = True
    # MeshConfig defaultConfig.proxyMetadata: environment of every injected agent, as Istio
    # sets it; defaultConfig.drainDuration (seconds; None: the agent's default).
    proxy_metadata: tuple[tuple[str, str], ...] = ()
    drain_duration: float | None = None
    # Istio's sidecarInjectorWebhook.rewriteAppHTTPProbe: the default for pods without the
    # sidecar.istio.io/rewriteAppHTTPProbers annotation.
    rewrite_app_probes: bool = True
    # The control plane's --revision ("" = the default revision).
    revision: str = ""


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


def prometheus_annotations(
    annotations: Mapping[str, Any], values: InjectionValues = InjectionValues()
) -> dict[str, str]:
    """The scrape annotations injection sets ({} when it leaves the pod's alone)."""
    merge = annotations.get(MERGE_METRICS_ANNOTATION)
    if merge is not None:
        if str(merge) not in (*_GO_TRUE, *_GO_FALSE):
            raise InjectionError(
                f'annotation {MERGE_METRICS_ANNOTATION}: {merge!r} is not "true" or "false"'
            )
        if str(merge) in _GO_FALSE:
            return {}
    elif not values.prometheus_merge:
        return {}
    own = {_LABEL_UNSAFE.sub("_", str(k)): str(v) for k, v in annotations.items()}
    if own.get("prometheus_io_scrape") in _GO_FALSE:
        return {}  # the pod asks not to be scraped (an unparsable value counts as yes)
    if own.get("prometheus_io_port") == PROMETHEUS_ANNOTATIONS["prometheus.io/port"]:
        return {}  # already ours: injected before, or the user points at the agent
    if "prometheus_io_port" in own or "prometheus_io_path" in own:
        return {}  # the pod's own scrape target (see the module docstring)
    return dict(PROMETHEUS_ANNOTATIONS)


def pilot_address(values: InjectionValues) -> str:
    """Where the injected agent connects: as given, else the revision's own control plane
    service (Istio's istiod-<rev>), which is what keeps a canary's pods on the canary."""
    if values.pilot_address or not values.revision:
        return values.pilot_address
    return f"istiod-{values.revision}.istio-system.svc:15012"


def templates(pod: Mapping[str, Any]) -> list[str]:
    """The injection templates the pod names (Istio's `inject.istio.io/templates`)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    raw = str(annotations.get(TEMPLATES_ANNOTATION) or "")
    return [t.strip() for t in raw.split(",") if t.strip()]


def interception_mode(pod: Mapping[str, Any]) -> str:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    mode = str(annotations.get(INTERCEPTION_ANNOTATION) or "NONE").strip().upper()
    if mode not in INTERCEPTION_MODES:
        raise InjectionError(
            f"annotation {INTERCEPTION_ANNOTATION}: {mode!r} is not one of "
            f"{', '.join(INTERCEPTION_MODES)}"
        )
    return mode


def hold_application(pod: Mapping[str, Any], values: InjectionValues) -> bool:
    """holdApplicationUntilProxyStarts: the pod's proxy.istio.io/config (YAML or JSON, a
    ProxyConfig as Istio parses it) over the mesh default."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(PROXY_CONFIG_ANNOTATION)
    if raw is None:
        return values.hold_application_until_proxy_starts
    what = f"annotation {PROXY_CONFIG_ANNOTATION}"
    try:
        doc = yaml.safe_load(str(raw))
    except yaml.YAMLError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InjectionError(f"{what}: not YAML or JSON: {first}") from None
    if doc is None:
        return values.hold_application_until_proxy_starts
    if not isinstance(doc, dict):
        raise InjectionError(f"{what}: expected a ProxyConfig mapping")
    value = doc.get(HOLD_KEY)
    if value is None:
        return values.hold_application_until_proxy_starts
    if not isinstance(value, bool):
        raise InjectionError(f"{what}: {HOLD_KEY}: {value!r} is not true or false")
    return value


def native_sidecars(pod: Mapping[str, Any], values: InjectionValues) -> bool:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(NATIVE_SIDECAR_ANNOTATION)
    if raw is None:
        return values.native_sidecars
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise InjectionError(
            f'annotation {NATIVE_SIDECAR_ANNOTATION}: {raw!r} is not "true" or "false"'
        )
    return value == "true"


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
        capture_args = _capture_args(meta.get("annotations") or {})
        for c in init_containers:
            c["args"] = [*(c.get("args") or ()), *capture_args]
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
        patch += _append("/spec/containers", spec.get("containers"), containers)
    else:
        patch += _append("/spec/containers", spec.get("containers"), [*first, *containers])
    patch += _append("/spec/volumes", spec.get("volumes"), volumes)
    status: dict[str, Any] = {
        "initContainers": [c["name"] for c in init_containers],
        "containers": [c["name"] for c in (*first, *containers)],
        "volumes": [v["name"] for v in volumes],
        "revision": values.revision or DEFAULT_REVISION,
    }
    patch += _set_keys(
        "/metadata/annotations",
        meta.get("annotations"),
        {STATUS_ANNOTATION: json.dumps(status, separators=(",", ":")), **scrape},
    )
    patch += _set_key("/metadata/labels", meta.get("labels"), TLS_MODE_LABEL, "istio")
    if values.revision:
        # As Istio's template: which revision's proxy the pod runs (what `istioctl
        # proxy-status` and a canary's rollout look at).
        patch += _set_key(
            "/metadata/labels", {TLS_MODE_LABEL: "istio"}, REVISION_LABEL, values.revision
        )
    return decision, patch


def apply_patch(doc: Mapping[str, Any], patch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The document with the patch applied (RFC 6902 `add`, the only op injection emits),
    as the API server applies it; the input is not modified."""
    out: dict[str, Any] = copy.deepcopy(dict(doc))
    for op in patch:
        if op.get("op") != "add":
            raise ValueError(f"unsupported patch op {op.get('op')!r}")
        *parents, last = [_unescape(p) for p in str(op["path"]).split("/")[1:]]
        target: Any = out
        for p in parents:
            target = target[int(p)] if isinstance(target, list) else target[p]
        value = copy.deepcopy(op["value"])
        if isinstance(target, list):
            if last == "-":
                target.append(value)
            else:
                target.insert(int(last), value)
        else:
            target[last] = value
    return out


def _capture_args(annotations: Mapping[str, Any]) -> list[str]:
    args: list[str] = []
    for name, flag, kind in _CAPTURE_FLAGS:
        raw = annotations.get(_CAPTURE + name)
        if raw is None:
            continue
        text = str(raw)
        items = [p.strip() for p in text.split(",") if p.strip()]
        what = f"annotation {_CAPTURE}{name}"
        if items == ["*"] and kind.endswith("*"):
            pass
        elif kind.startswith("ports"):
            for p in items:
                if not p.isdigit() or not 0 < int(p) < 65536:
                    raise InjectionError(f"{what}: {p!r} is not a port number")
        else:
            for p in items:
                try:
                    ipaddress.ip_network(p, strict=False)
                except ValueError:
                    raise InjectionError(f"{what}: {p!r} is not an IP range") from None
        if flag == "--exclude-inbound-ports":
            items = list(dict.fromkeys([*_ALWAYS_EXCLUDED_INBOUND, *items]))
        args += [flag, ",".join(items)]
    return args


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


def _append(path: str, existing: object, items: Sequence[Any]) -> list[dict[str, Any]]:
    if not items:
        return []
    if existing:
        return [{"op": "add", "path": f"{path}/-", "value": item} for item in items]
    return [{"op": "add", "path": path, "value": list(items)}]


def _set_key(path: str, existing: object, key: str, value: str) -> list[dict[str, Any]]:
    return _set_keys(path, existing, {key: value})


def _set_keys(path: str, existing: object, items: Mapping[str, str]) -> list[dict[str, Any]]:
    if isinstance(existing, Mapping) and existing:
        return [{"op": "add", "path": f"{path}/{_escape(k)}", "value": v} for k, v in items.items()]
    return [{"op": "add", "path": path, "value": dict(items)}]


def _escape(token: str) -> str:
    """RFC 6901: `~` and `/` inside a key (label keys have slashes)."""
    return token.replace("~", "~0").replace("/", "~1")


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")
