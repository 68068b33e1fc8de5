"""App probe rewriting, as Istio's injector does it (pure, no I/O).

Under STRICT mTLS the kubelet's plaintext probes to the app's ports would be refused by the
sidecar, so each app container's httpGet / tcpSocket / grpc `livenessProbe`, `readinessProbe`
and `startupProbe` becomes an httpGet of `/app-health/<container>/livez|readyz|startupz` on
the agent's status port (15020); the original goes to the agent in `ISTIO_KUBE_APP_PROBERS`,
Istio's JSON: `{"/app-health/web/readyz": {"httpGet": {...}, "timeoutSeconds": 1}, ...}`, with
named ports resolved to numbers (the agent does not know the container's port names). The
agent runs the original from inside the pod (agent/health/appprobe.py). The probe's other
fields (period, thresholds, initial delay) stay as they are; HTTPS becomes HTTP to the agent,
which itself speaks HTTPS to the app. `exec` probes are left alone (nothing to reach).

Opt out per pod with the annotation `sidecar.istio.io/rewriteAppHTTPProbers: "false"`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

REWRITE_ANNOTATION = "sidecar.istio.io/rewriteAppHTTPProbers"
PROBERS_ENV = "ISTIO_KUBE_APP_PROBERS"
STATUS_PORT = 15020
# Kubernetes' probe field -> the path suffix Istio uses for it.
PROBE_KINDS = (
    ("livenessProbe", "livez"),
    ("readinessProbe", "readyz"),
    ("startupProbe", "startupz"),
)
_ACTIONS = ("httpGet", "tcpSocket", "grpc")
# strconv.ParseBool's words, which Istio's annotation parsing accepts.
_TRUE = frozenset(("1", "t", "T", "TRUE", "true", "True"))
_FALSE = frozenset(("0", "f", "F", "FALSE", "false", "False"))


class ProbeRewriteError(ValueError):
    """A probe or the opt-out annotation cannot be used as given."""


def rewrite_wanted(annotations: Mapping[str, Any], default: bool = True) -> bool:
    raw = annotations.get(REWRITE_ANNOTATION)
    if raw is None:
        return default
    text = str(raw).strip()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ProbeRewriteError(f'annotation {REWRITE_ANNOTATION}: {raw!r} is not "true" or "false"')


def app_probe_path(container: str, suffix: str) -> str:
    return f"/app-health/{container}/{suffix}"


def rewrite_probes(
    containers: Sequence[Mapping[str, Any]], status_port: int = STATUS_PORT
) -> tuple[list[tuple[int, str, dict[str, Any]]], dict[str, dict[str, Any]]]:
    """([(container index, probe field, new probe)], probers for ISTIO_KUBE_APP_PROBERS), for
    the pod's own containers (injection adds the agent's after this)."""
    changes: list[tuple[int, str, dict[str, Any]]] = []
    probers: dict[str, dict[str, Any]] = {}
    for index, container in enumerate(containers):
        name = str(container.get("name") or "")
        for field, suffix in PROBE_KINDS:
            probe = container.get(field)
            if not isinstance(probe, Mapping):
                continue
            actions = [a for a in _ACTIONS if probe.get(a) is not None]
            if not actions:
                continue  # exec: run by the kubelet inside the container, nothing to reach
            what = f"container {name}: {field}"
            if len(actions) > 1:
                raise ProbeRewriteError(f"{what}: more than one of {', '.join(actions)}")
            path = app_probe_path(name, suffix)
            probers[path] = _prober(container, probe, actions[0], what)
            changes.append((index, field, _rewritten(probe, actions[0], path, status_port)))
    return changes, probers


def probers_env(probers: Mapping[str, Mapping[str, Any]]) -> str:
    """The env value: compact and with sorted keys, as Go's json.Marshal writes Istio's."""
    return json.dumps(probers, separators=(",", ":"), sort_keys=True)


def _prober(
    container: Mapping[str, Any], probe: Mapping[str, Any], action: str, what: str
) -> dict[str, Any]:
    spec = probe.get(action)
    if not isinstance(spec, Mapping):
        raise ProbeRewriteError(f"{what}: {action} must be an object")
    out = copy.deepcopy(dict(spec))
    out["port"] = _port_number(container, spec.get("port"), f"{what}: {action}.port")
    prober: dict[str, Any] = {action: out}
    timeout = probe.get("timeoutSeconds")
    if timeout is not None:
        if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 0:
            raise ProbeRewriteError(f"{what}: timeoutSeconds {timeout!r} is not a whole number")
        if timeout:
            prober["timeoutSeconds"] = timeout
    return prober


def _port_number(container: Mapping[str, Any], port: object, what: str) -> int:
    if isinstance(port, int) and not isinstance(port, bool):
        number = port
    elif isinstance(port, str) and port.isdigit():
        number = int(port)
    elif isinstance(port, str) and port:
        # A named port: the container's ports say which number it is.
        for p in container.get("ports") or ():
            if isinstance(p, Mapping) and p.get("name") == port:
                number = p.get("containerPort")  # type: ignore[assignment]
                break
        else:
            raise ProbeRewriteError(f"{what}: {port!r} is not a named port of the container")
    else:
        raise ProbeRewriteError(f"{what}: missing or not a port")
    if not isinstance(number, int) or not 0 < number < 65536:
        raise ProbeRewriteError(f"{what}: {number!r} is not a port number")
    return number


def _rewritten(
    probe: Mapping[str, Any], action: str, path: str, status_port: int
) -> dict[str, Any]:
    out = copy.deepcopy(dict(probe))
    if action == "httpGet":
        http = dict(out["httpGet"])
        # The kubelet talks plain HTTP to the agent; the agent uses the app's scheme.
        http.pop("scheme", None)
        http.pop("host", None)
        http.update(path=path, port=status_port)
        out["httpGet"] = http
    else:
        del out[action]
        out["httpGet"] = {"path": path, "port": status_port}
    return out
