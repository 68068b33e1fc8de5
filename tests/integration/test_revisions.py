"""Two revisions side by side, as an Istio canary upgrade: a default control plane and one
started with revision `canary`, both in Kubernetes mode against the in-test API server, each
serving its own injection webhook over HTTPS. Each keeps the caBundle of its own webhook
configuration, injects only the pods of its revision (namespace istio.io/rev, else the pod's;
istio-injection means the default revision), points them at its own control plane service,
and serves only the Istio config labelled for it (or for every revision)."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from pathlib import Path
from typing import Any

from control.app import ControlPlane, ControlPlaneOptions
from control.webhook.cabundle import ca_bundle
from control.webhook.jsonpatch import apply_patch
from tests.integration.test_webhook import webhook_configuration
from tests.support.admission import admission_review
from tests.support.controlplane import eventually
from tests.support.kubeapi import FakeKubeApi


def control_plane(kubeconfig: Path, revision: str, webhook_name: str) -> ControlPlane:
    return ControlPlane(
        ControlPlaneOptions(
            kubernetes=True,
            kubeconfig=str(kubeconfig),
            xds_address="127.0.0.1:0",
            secure_xds_address="",
            http_address="127.0.0.1:0",
            webhook_address="127.0.0.1:0",
            webhook_config_name=webhook_name,
            revision=revision,
            id=revision or "default",
        )
    )


def app_pod(**labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "web-", "labels": {"app": "web", **labels}},
        "spec": {"containers": [{"name": "web", "image": "web:1"}]},
    }


async def injected_by(cp: ControlPlane, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as this control plane's webhook leaves it ({} when it does not inject)."""
    response = await admission_review(cp, pod, namespace)
    assert response["allowed"] is True, response
    if "patch" not in response:
        return {}
    return apply_patch(pod, json.loads(base64.b64decode(response["patch"])))


async def tls_name_accepted(cp: ControlPlane, name: str) -> bool:
    """Whether the webhook's certificate verifies for `name` against the mesh root."""
    assert cp.ca is not None
    ctx = ssl.create_default_context(cadata=cp.ca.root_pem)
    try:
        _, writer = await asyncio.open_connection(
            "127.0.0.1", cp.webhook_port, ssl=ctx, server_hostname=name
        )
    except ssl.SSLCertVerificationError:
        return False
    writer.close()
    await writer.wait_closed()
    return True


def service_entry(name: str, host: str, revision: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if revision is not None:
        meta["labels"] = {"istio.io/rev": revision}
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": meta,
        "spec": {
            "hosts": [host],
            "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
            "resolution": "DNS",
        },
    }


async def test_default_and_canary_side_by_side(tmp_path: Path) -> None:
    async with FakeKubeApi() as api:
        api.put(
            {
                "kind": "Namespace",
                "metadata": {"name": "prod", "labels": {"istio-injection": "enabled"}},
            }
        )
        api.put(
            {
                "kind": "Namespace",
                "metadata": {"name": "next", "labels": {"istio.io/rev": "canary"}},
            }
        )
        api.put({"kind": "Namespace", "metadata": {"name": "plain"}})
        default_hooks = webhook_configuration()
        canary_hooks = webhook_configuration()
        canary_hooks["metadata"]["name"] = "pilotfish-sidecar-injector-canary"
        api.put(default_hooks)
        api.put(canary_hooks)
        api.put(service_entry("everyone", "all.example.com", None))
        api.put(service_entry("stable-only", "stable.example.com", "default"))
        api.put(service_entry("canary-only", "canary.example.com", "canary"))
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig())
        default = control_plane(kubeconfig, "", "pilotfish-sidecar-injector")
        canary = control_plane(kubeconfig, "canary", "pilotfish-sidecar-injector-canary")
        async with default, canary:
            for cp, name in (
                (default, "pilotfish-sidecar-injector"),
                (canary, "pilotfish-sidecar-injector-canary"),
            ):
                assert cp.ca is not None
                want = ca_bundle(cp.ca.root_pem)

                def patched(name: str = name, want: str = want) -> bool:
                    stored = api.objects["mutatingwebhookconfigurations"][("", name)]
                    return all(w["clientConfig"]["caBundle"] == want for w in stored["webhooks"])

                await eventually(patched, what=f"caBundle of {name}")

            # Each serves its webhook under its own Service name (the canary's pods and the API
            # server reach it as istiod-canary.istio-system.svc).
            assert await tls_name_accepted(canary, "istiod-canary.istio-system.svc")
            assert not await tls_name_accepted(default, "istiod-canary.istio-system.svc")
            assert await tls_name_accepted(default, "istiod.istio-system.svc")

            cases = [
                ("prod", app_pod(), "default"),
                ("prod", app_pod(**{"istio.io/rev": "canary"}), "default"),  # namespace wins
                ("next", app_pod(), "canary"),
                ("next", app_pod(**{"sidecar.istio.io/inject": "false"}), None),
                ("plain", app_pod(**{"istio.io/rev": "canary"}), "canary"),
                ("plain", app_pod(**{"sidecar.istio.io/inject": "true"}), "default"),
                ("plain", app_pod(), None),
            ]
            for namespace, pod, owner in cases:
                by_default = await injected_by(default, namespace, pod)
                by_canary = await injected_by(canary, namespace, pod)
                what = f"{namespace} {pod['metadata']['labels']}"
                assert bool(by_default) is (owner == "default"), what
                assert bool(by_canary) is (owner == "canary"), what
                out = by_default or by_canary
                if not out:
                    continue
                proxy = next(c for c in out["spec"]["containers"] if c["name"] == "istio-proxy")
                env = {e["name"]: e.get("value") for e in proxy["env"]}
                status = json.loads(out["metadata"]["annotations"]["sidecar.istio.io/status"])
                assert status["revision"] == owner, what
                if owner == "canary":
                    assert env["PILOT_ADDRESS"] == "istiod-canary.istio-system.svc:15012"
                    assert out["metadata"]["labels"]["istio.io/rev"] == "canary"
                else:
                    assert env["PILOT_ADDRESS"] == "istiod.istio-system.svc:15012"

            # Config: each revision serves what is labelled for it, and the unlabelled.
            def hosts(cp: ControlPlane) -> set[str]:
                return {h for h in cp.index.service_by_host if h.endswith(".example.com")}

            await eventually(lambda: hosts(default) and hosts(canary), what="service entries")
            assert hosts(default) == {"all.example.com", "stable.example.com"}
            assert hosts(canary) == {"all.example.com", "canary.example.com"}
            # Relabelled for the canary: the default drops it, the canary picks it up.
            api.put(service_entry("stable-only", "stable.example.com", "canary"))
            await eventually(
                lambda: (
                    "stable.example.com" in hosts(canary)
                    and "stable.example.com" not in hosts(default)
                ),
                what="relabelled ServiceEntry moves to the canary",
            )
