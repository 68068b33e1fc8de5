"""`ISTIO_KUBE_APP_PROBERS`: the app's original probes, as the injector handed them to the
agent (control/webhook/probes.py writes it), parsed strictly into values (sans-IO).

Istio's JSON: an object from `/app-health/<container>/livez|readyz|startupz` to a prober with
exactly one of `httpGet` (`path`, `port`, `scheme`, `httpHeaders`; `host` is ignored, as
Istio's agent ignores it: probes go to the pod), `tcpSocket` (`port`) or `grpc` (`port`,
`service`), and `timeoutSeconds` (default 1, Kubernetes' default). Ports are numbers: the
injector resolved named ones. A bad value is one error naming the path and field, given at
start (the agent refuses to run rather than answer probes wrongly for the pod's lifetime).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from agent.health import APP_PROBERS_ENV as ENV
from pilotfish_common.jsonobject import json_object

_PATH = re.compile(r"/app-health/[^/]+/(livez|readyz|startupz)")
_KINDS = ("httpGet", "tcpSocket", "grpc")
_FIELDS = {
    "httpGet": frozenset(("path", "port", "host", "scheme", "httpHeaders")),
    "tcpSocket": frozenset(("port", "host")),
    "grpc": frozenset(("port", "service")),
}


class AppProbersError(ValueError):
    """ISTIO_KUBE_APP_PROBERS is not what the injector writes."""


@dataclass(frozen=True, slots=True)
class AppProber:
    kind: str  # httpGet, tcpSocket or grpc
    port: int
    timeout: float = 1.0
    path: str = "/"  # httpGet
    https: bool = False  # httpGet
    headers: tuple[tuple[str, str], ...] = ()  # httpGet, in the given order
    service: str = ""  # grpc


def parse_app_probers(text: str) -> dict[str, AppProber]:
    """{status-server path: prober}; "" (not set) is no probers."""
    if not text.strip():
        return {}
    try:
        doc = json_object(text, "a JSON object of paths to probers")
    except ValueError as e:
        raise AppProbersError(f"{ENV}: {e}") from None
    return {path: _prober(path, value) for path, value in doc.items()}


def _prober(path: str, value: object) -> AppProber:
    what = f"{ENV}: {path}"
    if not _PATH.fullmatch(path):
        raise AppProbersError(f"{what}: not a path /app-health/<container>/livez|readyz|startupz")
    if not isinstance(value, dict):
        raise AppProbersError(f"{what}: expected an object")
    unknown = sorted(set(value) - {*_KINDS, "timeoutSeconds"})
    if unknown:
        raise AppProbersError(f"{what}: unsupported field {', '.join(unknown)}")
    kinds = [k for k in _KINDS if value.get(k) is not None]
    if len(kinds) != 1:
        raise AppProbersError(f"{what}: needs exactly one of {', '.join(_KINDS)}")
    kind = kinds[0]
    timeout = value.get("timeoutSeconds", 0)
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 0:
        raise AppProbersError(f"{what}: timeoutSeconds {timeout!r} is not a whole number")
    spec = value[kind]
    if not isinstance(spec, dict):
        raise AppProbersError(f"{what}: {kind} must be an object")
    unknown = sorted(set(spec) - _FIELDS[kind])
    if unknown:
        raise AppProbersError(f"{what}: {kind}: unsupported field {', '.join(unknown)}")
    port = spec.get("port")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise AppProbersError(f"{what}: {kind}.port {port!r} is not a port number")
    prober = AppProber(kind, port, float(timeout or 1))
    if kind == "httpGet":
        return _http(what, spec, prober)
    if kind == "grpc":
        service = spec.get("service")
        if service is not None and not isinstance(service, str):
            raise AppProbersError(f"{what}: grpc.service must be a string")
        return AppProber(kind, port, prober.timeout, service=service or "")
    return prober


def _http(what: str, spec: Mapping[str, object], base: AppProber) -> AppProber:
    path = spec.get("path", "/")
    if not isinstance(path, str):
        raise AppProbersError(f"{what}: httpGet.path must be a string")
    if not path.startswith("/"):
        path = "/" + path  # as Istio's agent and the kubelet do
    if any(c in path for c in "\r\n "):
        raise AppProbersError(f"{what}: httpGet.path {path!r} has spaces or line breaks")
    scheme = str(spec.get("scheme") or "HTTP").upper()
    if scheme not in ("HTTP", "HTTPS"):
        raise AppProbersError(f"{what}: httpGet.scheme {scheme!r} is not HTTP or HTTPS")
    headers: list[tuple[str, str]] = []
    raw = spec.get("httpHeaders") or []
    if not isinstance(raw, list):
        raise AppProbersError(f"{what}: httpGet.httpHeaders must be a list")
    for h in raw:
        if (
            not isinstance(h, dict)
            or not isinstance(h.get("name"), str)
            or not isinstance(h.get("value", ""), str)
        ):
            raise AppProbersError(f"{what}: httpGet.httpHeaders: expected {{name, value}}")
        name, val = h["name"], h.get("value", "")
        if not name or any(c in name + val for c in "\r\n") or ":" in name:
            raise AppProbersError(f"{what}: httpGet.httpHeaders: bad header {name!r}")
        headers.append((name, val))
    return AppProber(
        "httpGet",
        base.port,
        base.timeout,
        path=path,
        https=scheme == "HTTPS",
        headers=tuple(headers),
    )
