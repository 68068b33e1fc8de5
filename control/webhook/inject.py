"""Sidecar injection as a pure function: (pod, namespace labels, template, values) in, a JSON
patch (RFC 6902) out. The admission webhook and `pilotfish-ctl kube-inject` both use it; no I/O.

Who gets a sidecar follows Istio:
- never in kube-system / kube-public, never host-network pods, never twice (the pod already
  has the `sidecar.istio.io/status` annotation or an `istio-proxy` container);
- the pod's `sidecar.istio.io/inject` label (or, failing that, annotation) decides first:
  "false" opts out, "true" opts in;
- otherwise the namespace label `istio-injection=enabled` opts the pod in;
- a namespace labelled `istio-injection=disabled` is never injected.

What it adds: the template's agent container (with the pod's labels as ISTIO_META_LABELS), its
volumes, the status annotation and the `security.istio.io/tlsMode: istio` label (auto mTLS
knows the pod has a sidecar). When the pod asks for interception mode REDIRECT (annotation
`sidecar.istio.io/interceptionMode`), also the capture init container, first, with args from
Istio's `traffic.sidecar.istio.io/*` annotations.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from control.webhook.template import PROXY_CONTAINER, SidecarTemplate

NAMESPACE_LABEL = "istio-injection"
INJECT_KEY = "sidecar.istio.io/inject"
STATUS_ANNOTATION = "sidecar.istio.io/status"
INTERCEPTION_ANNOTATION = "sidecar.istio.io/interceptionMode"
TLS_MODE_LABEL = "security.istio.io/tlsMode"
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


@dataclass(frozen=True, slots=True)
class Decision:
    inject: bool
    reason: str


def decide(pod: Mapping[str, Any], namespace_labels: Mapping[str, str] | None) -> Decision:
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
    if asked is not None:
        value = str(asked).strip().lower()
        if value in ("false", "n", "no", "off", "0"):
            return Decision(False, f"{INJECT_KEY}={asked} (opt-out)")
        if value in ("true", "y", "yes", "on", "1"):
            return Decision(True, f"{INJECT_KEY}={asked}")
    if ns_labels.get(NAMESPACE_LABEL) == "enabled":
        return Decision(True, f"namespace label {NAMESPACE_LABEL}=enabled")
    return Decision(False, "neither the pod nor its namespace asks for injection")


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
    decision = decide(pod, namespace_labels)
    if not decision.inject:
        return decision, []
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    gateway = GATEWAY_TEMPLATE in templates(pod)
    mode = "REDIRECT" if gateway else interception_mode(pod)
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
        if values.pilot_address:
            env = _set_env(env, "PILOT_ADDRESS", values.pilot_address)
        if mode == "REDIRECT":
            env = _set_env(env, "ISTIO_META_INTERCEPTION_MODE", "REDIRECT")
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

    patch: list[dict[str, Any]] = []
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
    status = {
        "initContainers": [c["name"] for c in init_containers],
        "containers": [c["name"] for c in (*first, *containers)],
        "volumes": [v["name"] for v in volumes],
    }
    patch += _set_key(
        "/metadata/annotations",
        meta.get("annotations"),
        STATUS_ANNOTATION,
        json.dumps(status, separators=(",", ":")),
    )
    patch += _set_key("/metadata/labels", meta.get("labels"), TLS_MODE_LABEL, "istio")
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
    if isinstance(existing, Mapping) and existing:
        return [{"op": "add", "path": f"{path}/{_escape(key)}", "value": value}]
    return [{"op": "add", "path": path, "value": {key: value}}]


def _escape(token: str) -> str:
    """RFC 6901: `~` and `/` inside a key (label keys have slashes)."""
    return token.replace("~", "~0").replace("/", "~1")


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")
