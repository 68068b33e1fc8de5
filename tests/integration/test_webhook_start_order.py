"""Start order through the control plane's real injection webhook (HTTPS, certificate from
its CA, AdmissionReview v1), the answer applied as the API server applies it: with
holdApplicationUntilProxyStarts the agent is the first container with Istio's postStart
hook (ours: `pilotfish-agent wait`); with native sidecars it is an init container with
restartPolicy Always and no hook."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from control.app import ControlPlane, ControlPlaneOptions
from control.webhook.jsonpatch import apply_patch
from tests.support.admission import admission_review

HOLD = {"proxy.istio.io/config": "holdApplicationUntilProxyStarts: true"}


def pod(annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "web-5c7f-",
            "labels": {"app": "web", "sidecar.istio.io/inject": "true"},
            "annotations": annotations,
        },
        "spec": {
            "containers": [{"name": "web", "image": "web:1"}, {"name": "log", "image": "log:1"}],
            "initContainers": [{"name": "migrate", "image": "web:1"}],
        },
    }


async def inject(cp: ControlPlane, obj: dict[str, Any]) -> dict[str, Any]:
    response = await admission_review(cp, obj)
    assert response["allowed"] is True and response["patchType"] == "JSONPatch", response
    return apply_patch(obj, json.loads(base64.b64decode(response["patch"])))


def control_plane(tmp_path: Path, **options: Any) -> ControlPlane:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    return ControlPlane(
        ControlPlaneOptions(
            config_paths=(str(cfg),),
            xds_address="127.0.0.1:0",
            http_address="127.0.0.1:0",
            webhook_address="127.0.0.1:0",
            **options,
        )
    )


def names(items: list[dict[str, Any]]) -> list[str]:
    return [c["name"] for c in items]


async def test_hold_and_native_sidecars_over_https(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as cp:
        out = await inject(cp, pod(HOLD))
        spec = out["spec"]
        assert names(spec["containers"]) == ["istio-proxy", "web", "log"]
        assert spec["containers"][0]["lifecycle"] == {
            "postStart": {"exec": {"command": ["pilotfish-agent", "wait"]}}
        }
        assert names(spec["initContainers"]) == ["migrate"]

        # Without the option: the agent last and no hook, as before.
        out = await inject(cp, pod({}))
        assert names(out["spec"]["containers"]) == ["web", "log", "istio-proxy"]
        assert "lifecycle" not in out["spec"]["containers"][2]

        out = await inject(cp, pod({**HOLD, "sidecar.istio.io/nativeSidecar": "true"}))
        spec = out["spec"]
        assert names(spec["containers"]) == ["web", "log"]
        assert names(spec["initContainers"]) == ["istio-proxy", "migrate"]
        agent = spec["initContainers"][0]
        assert agent["restartPolicy"] == "Always" and "lifecycle" not in agent
        assert agent["startupProbe"]["httpGet"]["path"] == "/healthz/ready"


async def test_mesh_defaults_from_the_control_planes_options(tmp_path: Path) -> None:
    async with control_plane(tmp_path, injection_hold_application=True) as cp:
        out = await inject(cp, pod({}))
        assert names(out["spec"]["containers"])[0] == "istio-proxy"
        assert "postStart" in out["spec"]["containers"][0]["lifecycle"]
        # The pod's annotation wins over the mesh default.
        off = {"proxy.istio.io/config": '{"holdApplicationUntilProxyStarts": false}'}
        out = await inject(cp, pod(off))
        assert names(out["spec"]["containers"]) == ["web", "log", "istio-proxy"]
