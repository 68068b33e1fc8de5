"""Gateway API objects for tests, as the manifests a user writes (dicts, dumped to YAML)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from control.config.loader import load_text
from control.config.merge import merge
from control.model.gatewayapi import CONTROLLER_NAME, GROUP, ObjectStatus
from control.model.types import Labels, MeshConfig

V1 = f"{GROUP}/v1"
Obj = dict[str, Any]


def gateway_class(name: str = "pilotfish", controller: str = CONTROLLER_NAME) -> Obj:
    return {
        "apiVersion": V1,
        "kind": "GatewayClass",
        "metadata": {"name": name},
        "spec": {"controllerName": controller},
    }


def listener(
    name: str = "http",
    port: int = 8080,
    protocol: str = "HTTP",
    *,
    hostname: str = "",
    from_: str = "",
    selector: dict[str, Any] | None = None,
    tls: dict[str, Any] | None = None,
    kinds: list[str] | None = None,
) -> Obj:
    out: Obj = {"name": name, "port": port, "protocol": protocol}
    if hostname:
        out["hostname"] = hostname
    allowed: Obj = {}
    if from_:
        allowed["namespaces"] = {"from": from_}
        if selector is not None:
            allowed["namespaces"]["selector"] = selector
    if kinds is not None:
        allowed["kinds"] = [{"kind": k} for k in kinds]
    if allowed:
        out["allowedRoutes"] = allowed
    if tls is not None:
        out["tls"] = tls
    return out


def gateway(
    name: str = "gw",
    namespace: str = "infra",
    listeners: list[Obj] | None = None,
    class_name: str = "pilotfish",
) -> Obj:
    return {
        "apiVersion": V1,
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"gatewayClassName": class_name, "listeners": listeners or [listener()]},
    }


def backend(name: str, port: int = 8080, weight: int | None = None, namespace: str = "") -> Obj:
    out: Obj = {"name": name, "port": port}
    if weight is not None:
        out["weight"] = weight
    if namespace:
        out["namespace"] = namespace
    return out


def route(
    name: str,
    namespace: str = "infra",
    *,
    kind: str = "HTTPRoute",
    parents: list[Obj] | None = None,
    hostnames: list[str] | None = None,
    rules: list[Obj] | None = None,
    api_version: str = V1,
) -> Obj:
    spec: Obj = {"parentRefs": parents if parents is not None else [{"name": "gw"}]}
    if hostnames:
        spec["hostnames"] = hostnames
    # By default one rule to the `v1` Service on 8080 (a route without rules serves nothing).
    spec["rules"] = rules if rules is not None else [{"backendRefs": [backend("v1")]}]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def reference_grant(
    name: str,
    namespace: str,
    from_namespace: str,
    *,
    from_kind: str = "HTTPRoute",
    to_kind: str = "Service",
    to_name: str = "",
) -> Obj:
    to: Obj = {"group": "", "kind": to_kind}
    if to_name:
        to["name"] = to_name
    return {
        "apiVersion": f"{GROUP}/v1beta1",
        "kind": "ReferenceGrant",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "from": [{"group": GROUP, "kind": from_kind, "namespace": from_namespace}],
            "to": [to],
        },
    }


def service(name: str, namespace: str = "infra", port: int = 8080, port_name: str = "http") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"app": name}, "ports": [{"name": port_name, "port": port}]},
    }


def dump(*objects: Obj) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False)


def load(
    *objects: Obj,
    namespace_labels: Callable[[str], Labels] = lambda _ns: (),
    secrets: set[tuple[str, str]] | None = None,
) -> MeshConfig:
    return merge(
        [load_text(dump(*objects), "gw.yaml")], namespace_labels=namespace_labels, secrets=secrets
    )


def status_of(mesh: MeshConfig, kind: str, namespace: str, name: str) -> ObjectStatus:
    for s in mesh.gateway_api_status:
        if (s.kind, s.namespace, s.name) == (kind, namespace, name):
            return s
    raise AssertionError(f"no status for {kind} {namespace}/{name}")


def conditions(mesh: MeshConfig, kind: str, namespace: str, name: str) -> dict[str, str]:
    """`{type: "True/Reason"}` of the first parent (routes) or of the object itself."""
    s = status_of(mesh, kind, namespace, name)
    found = s.parents[0].conditions if s.parents else s.conditions
    return {c.type: f"{c.status}/{c.reason}" for c in found}


# Rules with every match and filter we support (Envoy validates what they become; the config
# fuzz mutates them).
HTTP_RULES: list[Obj] = [
    {
        "matches": [
            {"path": {"type": "PathPrefix", "value": "/api/v1.0"}},
            {"path": {"type": "Exact", "value": "/exact"}, "method": "GET"},
            {
                "path": {"type": "RegularExpression", "value": "/r/[0-9]+"},
                "headers": [{"type": "RegularExpression", "name": "x-id", "value": "[a-z]+"}],
                "queryParams": [{"name": "q", "value": "1"}],
            },
        ],
        "filters": [
            {
                "type": "URLRewrite",
                "urlRewrite": {
                    "hostname": "inner.example.com",
                    "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/"},
                },
            },
            {
                "type": "RequestHeaderModifier",
                "requestHeaderModifier": {
                    "set": [{"name": "x-set", "value": "1"}],
                    "remove": ["x-drop"],
                },
            },
            {
                "type": "ResponseHeaderModifier",
                "responseHeaderModifier": {"add": [{"name": "x-resp", "value": "r"}]},
            },
            {
                "type": "RequestMirror",
                "requestMirror": {"backendRef": backend("v2"), "fraction": {"numerator": 1}},
            },
        ],
        "backendRefs": [backend("v1", weight=90), backend("v2", weight=10)],
    },
    {
        "matches": [{"path": {"value": "/full"}}],
        "filters": [
            {
                "type": "URLRewrite",
                "urlRewrite": {"path": {"type": "ReplaceFullPath", "replaceFullPath": "/x"}},
            }
        ],
        "backendRefs": [backend("v1")],
        "timeouts": {"request": "5s"},
    },
    {
        "matches": [{"path": {"value": "/old"}}],
        "filters": [
            {
                "type": "RequestRedirect",
                "requestRedirect": {"scheme": "https", "port": 8443, "statusCode": 308},
            }
        ],
    },
]
GRPC_RULES: list[Obj] = [
    {
        "matches": [
            {"method": {"service": "echo.Echo", "method": "Say"}},
            {"method": {"service": "echo.Echo"}},
            {"method": {"method": "Ping"}},
            {"method": {"type": "RegularExpression", "service": "echo\\..*"}},
        ],
        "backendRefs": [backend("v1")],
    }
]


def _everything() -> str:
    alpha = f"{GROUP}/v1alpha2"
    return dump(
        gateway_class(),
        service("v1"),
        service("v2"),
        gateway(
            listeners=[
                listener("http", 8080, hostname="*.example.com", from_="All"),
                listener(
                    "https",
                    8443,
                    "HTTPS",
                    from_="Selector",
                    selector={
                        "matchLabels": {"team": "a"},
                        "matchExpressions": [
                            {"key": "env", "operator": "In", "values": ["prod"]},
                            {"key": "legacy", "operator": "DoesNotExist"},
                        ],
                    },
                    tls={"mode": "Terminate", "certificateRefs": [{"name": "cert"}]},
                    kinds=["HTTPRoute", "GRPCRoute"],
                ),
                listener("pass", 9443, "TLS", tls={"mode": "Passthrough"}),
                listener("tcp", 9000, "TCP"),
            ]
        ),
        route("r", hostnames=["r.example.com"], rules=HTTP_RULES),
        route(
            "g",
            kind="GRPCRoute",
            parents=[{"name": "gw", "sectionName": "http", "port": 8080}],
            rules=GRPC_RULES,
        ),
        route("t", kind="TLSRoute", api_version=alpha, hostnames=["t.example.com"]),
        route("c", kind="TCPRoute", api_version=alpha),
        reference_grant("apps", "infra", "apps", to_name="v1"),
    )


GATEWAY_API_YAML = _everything()
