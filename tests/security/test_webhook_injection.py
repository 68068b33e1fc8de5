"""Pods that try to get more out of the injection webhook than a sidecar: a proxy image or
privileges of their choosing, the node's network, smuggled capture flags, a fake sidecar.
Each AdmissionReview goes over HTTPS to the control plane's real webhook (certificate from
its CA), and the answer is applied as the API server would apply it.

What happens (README, "Security model"): the sidecar's image, command and securityContext come
only from the template and the control plane's flags, never from the pod; host-network pods,
kube-system pods and pods that already have an `istio-proxy` container are left alone
(allowed, no patch); capture annotations with anything but port numbers / CIDRs are refused
(allowed: false, 400); a pod's own privileged containers are not the webhook's to judge
(left as they are, and the sidecar added beside them stays unprivileged)."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from control.app import ControlPlane, ControlPlaneOptions
from control.webhook.jsonpatch import apply_patch
from control.webhook.template import DEFAULT_TEMPLATE, load_template
from tests.support.admission import admission_review

TEMPLATE = load_template(DEFAULT_TEMPLATE)
PROXY = next(c for c in TEMPLATE.containers if c["name"] == "istio-proxy")
INIT = next(c for c in TEMPLATE.init_containers if c["name"] == "istio-init")


@pytest.fixture(scope="module")
async def webhook(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ControlPlane]:
    """One control plane for the module: the webhook keeps no state between reviews."""
    cfg = tmp_path_factory.mktemp("webhook-cfg")
    cp = ControlPlane(
        ControlPlaneOptions(
            config_paths=(str(cfg),),
            xds_address="127.0.0.1:0",
            http_address="127.0.0.1:0",
            webhook_address="127.0.0.1:0",
            config_poll_interval=0.05,
        )
    )
    async with cp:
        yield cp


def pod(
    *,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A pod that opts in to injection (file mode has no namespace labels)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0",
            "labels": {"app": "web", "sidecar.istio.io/inject": "true", **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "spec": {"containers": [{"name": "web", "image": "web:1"}], **spec},
    }


async def review(cp: ControlPlane, obj: dict[str, Any], namespace: str = "shop") -> dict[str, Any]:
    """POST an AdmissionReview as the API server does; the response part of the answer."""
    return await admission_review(cp, obj, namespace, uid="7f0b2f1c-attack")


def patched(obj: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    assert response["allowed"] is True and response["patchType"] == "JSONPatch", response
    return apply_patch(obj, json.loads(base64.b64decode(response["patch"])))


def container(obj: dict[str, Any], name: str, key: str = "containers") -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in obj["spec"][key] if c["name"] == name)
    return found


def assert_unprivileged_template_proxy(proxy: dict[str, Any]) -> None:
    assert proxy["image"] == PROXY["image"]
    assert proxy.get("command") == PROXY.get("command")
    assert proxy["args"] == PROXY["args"]
    assert proxy["securityContext"] == PROXY["securityContext"]
    ctx = proxy["securityContext"]
    assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] == 1337
    assert ctx["allowPrivilegeEscalation"] is False and not ctx.get("privileged")
    assert ctx["capabilities"] == {"drop": ["ALL"]}


async def test_pod_cannot_choose_a_privileged_proxy_image(webhook: ControlPlane) -> None:
    """Istio honours `sidecar.istio.io/proxyImage`; here no annotation changes what the
    sidecar runs or with which privileges."""
    obj = pod(
        annotations={
            "sidecar.istio.io/proxyImage": "attacker.example/evil:latest",
            "sidecar.istio.io/templates": "privileged",
            "sidecar.istio.io/userVolumeMount": '{"host":{"mountPath":"/host"}}',
            "sidecar.istio.io/userVolume": '{"host":{"hostPath":{"path":"/"}}}',
            "proxy.istio.io/config": '{"proxyMetadata": {"PRIVILEGED": "true"}}',
            "sidecar.istio.io/proxyCPU": "64",
        }
    )
    out = patched(obj, await review(webhook, obj))
    proxy = container(out, "istio-proxy")
    assert_unprivileged_template_proxy(proxy)
    assert proxy["volumeMounts"] == PROXY["volumeMounts"]
    assert proxy["resources"] == PROXY["resources"]
    assert all("hostPath" not in v for v in out["spec"]["volumes"])
    assert "initContainers" not in out["spec"]  # interception mode NONE: no NET_ADMIN


async def test_host_network_pod_is_left_alone(webhook: ControlPlane) -> None:
    """A host-network pod shares the node's network namespace: capturing it would rewrite the
    node's iptables. It asks for injection and REDIRECT, and gets nothing."""
    obj = pod(
        annotations={"sidecar.istio.io/interceptionMode": "REDIRECT"},
        hostNetwork=True,
    )
    response = await review(webhook, obj)
    assert response["allowed"] is True
    assert "patch" not in response


async def test_privileged_app_containers_get_an_unprivileged_sidecar(
    webhook: ControlPlane,
) -> None:
    """The pod's own privileges are its own (admission policy decides them, not injection);
    nothing of them is carried over to the sidecar, which keeps the template's context even
    under a pod-level runAsUser 0."""
    app = {
        "name": "web",
        "image": "web:1",
        "securityContext": {
            "privileged": True,
            "runAsUser": 0,
            "capabilities": {"add": ["SYS_ADMIN", "NET_ADMIN"]},
        },
    }
    obj = pod(
        annotations={"sidecar.istio.io/interceptionMode": "REDIRECT"},
        containers=[app],
        securityContext={"runAsUser": 0, "runAsNonRoot": False},
        hostPID=True,
    )
    out = patched(obj, await review(webhook, obj))
    assert container(out, "web") == app
    assert_unprivileged_template_proxy(container(out, "istio-proxy"))
    init = container(out, "istio-init", "initContainers")
    # The capture container: our image and command, NET_ADMIN/NET_RAW only, and no way up.
    assert init["image"] == INIT["image"] and init["command"] == INIT["command"]
    assert init["securityContext"] == INIT["securityContext"]
    assert not init["securityContext"].get("privileged")
    assert init["securityContext"]["capabilities"]["add"] == ["NET_ADMIN", "NET_RAW"]


@pytest.mark.parametrize(
    ("annotation", "value"),
    [
        ("traffic.sidecar.istio.io/excludeInboundPorts", "15020,--proxy-uid=0"),
        ("traffic.sidecar.istio.io/includeOutboundIPRanges", "10.0.0.0/8 --dry-run"),
        ("traffic.sidecar.istio.io/excludeOutboundPorts", "$(reboot)"),
    ],
    ids=["flag-in-ports", "flag-in-cidrs", "shell-in-ports"],
)
async def test_capture_annotations_cannot_smuggle_arguments(
    webhook: ControlPlane, annotation: str, value: str
) -> None:
    """The capture init container runs as root with NET_ADMIN: its args come from
    annotations, so anything but port numbers and CIDRs refuses the pod."""
    obj = pod(annotations={"sidecar.istio.io/interceptionMode": "REDIRECT", annotation: value})
    response = await review(webhook, obj)
    assert response["allowed"] is False, response
    assert response["status"]["code"] == 400
    assert annotation in response["status"]["message"]
    assert "patch" not in response


async def test_pod_with_its_own_istio_proxy_container_is_left_alone(
    webhook: ControlPlane,
) -> None:
    """A pod that brings a container named istio-proxy (or the status annotation) counts as
    injected: nothing is added, in particular not the tlsMode label that would have peers
    send it mTLS as if it had our sidecar."""
    fake = {"name": "istio-proxy", "image": "attacker.example/proxy", "securityContext": {}}
    obj = pod(containers=[{"name": "web", "image": "web:1"}, fake])
    response = await review(webhook, obj)
    assert response["allowed"] is True
    assert "patch" not in response


async def test_kube_system_pod_is_left_alone(webhook: ControlPlane) -> None:
    obj = pod()
    response = await review(webhook, obj, namespace="kube-system")
    assert response["allowed"] is True
    assert "patch" not in response
