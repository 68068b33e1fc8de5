"""The injection values (per mesh: flags and MeshConfig) and what a pod's own annotations
ask of injection (sans-IO): interception mode and capture ranges, the agent's start order,
Istio's `gateway` template, the control plane to connect to, Prometheus scraping.

Prometheus, as Istio's metrics merge: the pod gets `prometheus.io/scrape: "true"`,
`prometheus.io/port: "15020"` and `prometheus.io/path: /stats/prometheus` (the agent's merged
metrics), unless it opts out (`prometheus.io/scrape: "false"`, or
`prometheus.istio.io/merge-metrics: "false"`, or `InjectionValues.prometheus_merge` off: mesh
`enablePrometheusMerge`) or already names its own scrape port or path: Istio then moves those
into ISTIO_PROMETHEUS_ANNOTATIONS for its agent to scrape and merge, which our agent does not
do, so the pod's own annotations are kept and nothing of the app's metrics is lost.

A bad annotation value is an InjectionError naming the annotation, never a traceback.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

INTERCEPTION_ANNOTATION = "sidecar.istio.io/interceptionMode"
INTERCEPTION_MODES = ("NONE", "REDIRECT")
PROXY_CONFIG_ANNOTATION = "proxy.istio.io/config"
NATIVE_SIDECAR_ANNOTATION = "sidecar.istio.io/nativeSidecar"
HOLD_KEY = "holdApplicationUntilProxyStarts"
TEMPLATES_ANNOTATION = "inject.istio.io/templates"
GATEWAY_TEMPLATE = "gateway"

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


def capture_args(annotations: Mapping[str, Any]) -> list[str]:
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
