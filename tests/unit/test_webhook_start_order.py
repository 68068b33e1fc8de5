"""Start order in injection (control/webhook/inject.py), as Istio's template:
holdApplicationUntilProxyStarts puts the agent first with a postStart `pilotfish-agent wait`;
native sidecars make it an init container with restartPolicy Always (and no hook)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from kubernetes.client import ApiClient

from control.webhook.decision import STATUS_ANNOTATION
from control.webhook.inject import injection_patch
from control.webhook.jsonpatch import apply_patch
from control.webhook.template import load_template
from control.webhook.values import InjectionError, InjectionValues

TEMPLATE = load_template()
ENABLED = {"istio-injection": "enabled"}
HOLD = {"proxy.istio.io/config": '{"holdApplicationUntilProxyStarts": true}'}
POST_START = {"exec": {"command": ["pilotfish-agent", "wait"]}}


def pod(annotations: dict[str, str] | None = None, inits: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "web", "image": "web:1"}, {"name": "worker", "image": "w:1"}]
    }
    if inits:
        spec["initContainers"] = [{"name": "migrate", "image": "web:1"}]
    meta: dict[str, Any] = {"name": "web-1", "namespace": "shop", "labels": {"app": "web"}}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def inject(p: dict[str, Any], values: InjectionValues = InjectionValues()) -> dict[str, Any]:
    decision, patch = injection_patch(p, ENABLED, TEMPLATE, values)
    assert decision.inject, decision.reason
    out = apply_patch(p, patch)
    # Still a valid Pod for the Kubernetes schema (the models' round trip keeps every field).
    api = ApiClient()
    model = api._ApiClient__deserialize(out, "V1Pod")  # type: ignore[attr-defined]
    assert api.sanitize_for_serialization(model)["spec"] == out["spec"]
    return out


def names(items: list[dict[str, Any]]) -> list[str]:
    return [c["name"] for c in items]


def proxy(out: dict[str, Any], key: str = "containers") -> dict[str, Any]:
    return next(c for c in out["spec"][key] if c["name"] == "istio-proxy")


def test_default_agent_last_without_hook() -> None:
    out = inject(pod())
    assert names(out["spec"]["containers"]) == ["web", "worker", "istio-proxy"]
    assert "lifecycle" not in proxy(out)


@pytest.mark.parametrize(
    "config",
    [
        '{"holdApplicationUntilProxyStarts": true}',
        "holdApplicationUntilProxyStarts: true\n",
        "concurrency: 2\nholdApplicationUntilProxyStarts: true",
    ],
)
def test_hold_from_the_annotation_json_or_yaml(config: str) -> None:
    out = inject(pod({"proxy.istio.io/config": config}))
    assert names(out["spec"]["containers"]) == ["istio-proxy", "web", "worker"]
    assert proxy(out)["lifecycle"] == {"postStart": POST_START}
    status = json.loads(out["metadata"]["annotations"][STATUS_ANNOTATION])
    assert status["containers"] == ["istio-proxy"]


def test_hold_from_the_mesh_default_and_the_annotation_wins() -> None:
    values = InjectionValues(hold_application_until_proxy_starts=True)
    out = inject(pod(), values)
    assert names(out["spec"]["containers"])[0] == "istio-proxy"
    off = {"proxy.istio.io/config": "holdApplicationUntilProxyStarts: false"}
    out = inject(pod(off), values)
    assert names(out["spec"]["containers"]) == ["web", "worker", "istio-proxy"]
    # An annotation about something else leaves the mesh default in force.
    out = inject(pod({"proxy.istio.io/config": "concurrency: 2"}), values)
    assert names(out["spec"]["containers"])[0] == "istio-proxy"


def test_hold_keeps_the_templates_other_lifecycle_hooks() -> None:
    tpl = load_template()
    container = dict(tpl.containers[0])
    container["lifecycle"] = {"preStop": {"exec": {"command": ["sleep", "5"]}}}
    tpl = replace(tpl, containers=(container,))
    _, patch = injection_patch(pod(HOLD), ENABLED, tpl)
    out = apply_patch(pod(HOLD), patch)
    assert proxy(out)["lifecycle"] == {
        "preStop": {"exec": {"command": ["sleep", "5"]}},
        "postStart": POST_START,
    }
    # The template is not modified.
    assert tpl.containers[0]["lifecycle"] == {"preStop": {"exec": {"command": ["sleep", "5"]}}}


def test_native_sidecar_is_an_init_container_without_hook() -> None:
    out = inject(pod({**HOLD, "sidecar.istio.io/nativeSidecar": "true"}, inits=True))
    assert names(out["spec"]["containers"]) == ["web", "worker"]
    assert names(out["spec"]["initContainers"]) == ["istio-proxy", "migrate"]
    agent = proxy(out, "initContainers")
    assert agent["restartPolicy"] == "Always"
    assert "lifecycle" not in agent  # Kubernetes orders native sidecars itself
    # What kubelet waits for before the next container starts.
    assert agent["startupProbe"]["httpGet"] == {"path": "/healthz/ready", "port": 15021}
    assert agent["readinessProbe"]["httpGet"]["port"] == 15021
    status = json.loads(out["metadata"]["annotations"][STATUS_ANNOTATION])
    assert status["initContainers"] == ["istio-proxy"] and status["containers"] == []


def test_native_sidecar_after_capture_from_the_mesh_default() -> None:
    annotations = {"sidecar.istio.io/interceptionMode": "REDIRECT"}
    out = inject(pod(annotations, inits=True), InjectionValues(native_sidecars=True))
    assert names(out["spec"]["initContainers"]) == ["istio-init", "istio-proxy", "migrate"]
    assert proxy(out, "initContainers")["restartPolicy"] == "Always"
    # No existing init containers: the list is created in the same order.
    out = inject(pod(annotations), InjectionValues(native_sidecars=True))
    assert names(out["spec"]["initContainers"]) == ["istio-init", "istio-proxy"]
    # The annotation opts a pod out of the mesh default.
    out = inject(
        pod({"sidecar.istio.io/nativeSidecar": "false"}), InjectionValues(native_sidecars=True)
    )
    assert names(out["spec"]["containers"]) == ["web", "worker", "istio-proxy"]


def test_a_native_sidecar_counts_as_already_injected() -> None:
    out = inject(pod({"sidecar.istio.io/nativeSidecar": "true"}))
    del out["metadata"]["annotations"][STATUS_ANNOTATION]
    decision, patch = injection_patch(out, ENABLED, TEMPLATE)
    assert not decision.inject and patch == []


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({"proxy.istio.io/config": "{"}, "proxy.istio.io/config: not YAML or JSON"),
        ({"proxy.istio.io/config": "[1]"}, "expected a ProxyConfig mapping"),
        (
            {"proxy.istio.io/config": "holdApplicationUntilProxyStarts: yes please"},
            "holdApplicationUntilProxyStarts: 'yes please' is not true or false",
        ),
        ({"sidecar.istio.io/nativeSidecar": "maybe"}, "sidecar.istio.io/nativeSidecar: 'maybe'"),
    ],
)
def test_bad_annotations_are_one_line_errors(annotations: dict[str, str], message: str) -> None:
    with pytest.raises(InjectionError, match=message) as e:
        injection_patch(pod(annotations), ENABLED, TEMPLATE)
    assert "\n" not in str(e.value)
