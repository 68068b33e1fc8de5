"""The injection webhook and the CA-bundle patcher, for real: the control plane serves
AdmissionReview over HTTPS with a certificate from its CA, trusted through the caBundle the
patcher wrote into the MutatingWebhookConfiguration of the in-test API server
(tests/support/kubeapi.py); two patchers racing converge (409 Conflict, re-read, done) and
NotFound is not retried."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from pathlib import Path
from typing import Any

import aiohttp

from control.app import ControlPlane, ControlPlaneOptions
from control.ca.authority import in_memory_authority
from control.kube.client import KubeClient, KubeConfig, from_kubeconfig
from control.webhook.cabundle import CaBundlePatcher, ConflictRetry, Outcome, ca_bundle
from control.webhook.jsonpatch import apply_patch
from tests.support.controlplane import eventually
from tests.support.kubeapi import FakeKubeApi

NAME = "pilotfish-sidecar-injector"


def webhook_configuration(bundle: str = "") -> dict[str, Any]:
    """Two webhooks, as Istio installs them: namespaces labelled for injection, and pods
    labelled sidecar.istio.io/inject=true anywhere."""

    def hook(name: str, **selectors: Any) -> dict[str, Any]:
        return {
            "name": name,
            "clientConfig": {
                "service": {"name": "istiod", "namespace": "istio-system", "path": "/inject"},
                "caBundle": bundle,
            },
            "rules": [
                {
                    "operations": ["CREATE"],
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": ["pods"],
                }
            ],
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "failurePolicy": "Fail",
            **selectors,
        }

    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": NAME},
        "webhooks": [
            hook(
                "namespace.sidecar-injector.pilotfish.io",
                namespaceSelector={"matchLabels": {"istio-injection": "enabled"}},
            ),
            hook(
                "object.sidecar-injector.pilotfish.io",
                objectSelector={"matchLabels": {"sidecar.istio.io/inject": "true"}},
            ),
        ],
    }


def admission_review(namespace: str) -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "web-5c7f-", "labels": {"app": "web"}},
        "spec": {
            "serviceAccountName": "web",
            "containers": [{"name": "web", "image": "web:1"}],
        },
    }
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0df28fbd-5f5f-11e8-bc74-36e6bb280816",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }


async def call_webhook(port: int, bundle: str, review: dict[str, Any]) -> dict[str, Any]:
    """POST as the API server does: to the Service name, trusting only the caBundle."""
    ctx = ssl.create_default_context(cadata=base64.b64decode(bundle).decode())
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"https://127.0.0.1:{port}/inject?timeout=10s",
            json=review,
            ssl=ctx,
            server_hostname="istiod.istio-system.svc",
        ) as r,
    ):
        assert r.status == 200, await r.text()
        answer: dict[str, Any] = await r.json()
        return answer


async def test_webhook_over_https_with_the_patched_ca_bundle(tmp_path: Path) -> None:
    async with FakeKubeApi() as api:
        api.put(
            {
                "kind": "Namespace",
                "metadata": {"name": "shop", "labels": {"istio-injection": "enabled"}},
            }
        )
        api.put({"kind": "Namespace", "metadata": {"name": "plain"}})
        api.put(webhook_configuration())
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig())
        cp = ControlPlane(
            ControlPlaneOptions(
                kubernetes=True,
                kubeconfig=str(kubeconfig),
                xds_address="127.0.0.1:0",
                http_address="127.0.0.1:0",
                webhook_address="127.0.0.1:0",
                webhook_config_name=NAME,
                injection_pilot_address="istiod.istio-system.svc:15012",
            )
        )
        async with cp:
            assert cp.ca is not None and cp.webhook_port
            want = ca_bundle(cp.ca.root_pem)

            def patched() -> bool:
                stored = api.objects["mutatingwebhookconfigurations"][("", NAME)]
                return all(w["clientConfig"]["caBundle"] == want for w in stored["webhooks"])

            await eventually(patched, what="caBundle patched")
            stored = api.objects["mutatingwebhookconfigurations"][("", NAME)]
            bundle = stored["webhooks"][0]["clientConfig"]["caBundle"]
            # Everything else in the configuration is kept.
            assert stored["webhooks"][0]["namespaceSelector"] == {
                "matchLabels": {"istio-injection": "enabled"}
            }

            answer = await call_webhook(cp.webhook_port, bundle, admission_review("shop"))
            response = answer["response"]
            assert response["uid"] == "0df28fbd-5f5f-11e8-bc74-36e6bb280816"
            assert response["allowed"] is True and response["patchType"] == "JSONPatch"
            patch = json.loads(base64.b64decode(response["patch"]))
            pod = apply_patch(admission_review("shop")["request"]["object"], patch)
            agent = next(c for c in pod["spec"]["containers"] if c["name"] == "istio-proxy")
            env = {e["name"]: e.get("value", e.get("valueFrom")) for e in agent["env"]}
            assert env["PILOT_ADDRESS"] == "istiod.istio-system.svc:15012"
            assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
            assert env["ISTIO_META_LABELS"] == "app=web,security.istio.io/tlsMode=istio"
            assert {v["name"] for v in pod["spec"]["volumes"]} >= {"istio-token", "istio-envoy"}

            # A namespace without the label: allowed, unchanged.
            plain = (await call_webhook(cp.webhook_port, bundle, admission_review("plain")))[
                "response"
            ]
            assert plain["allowed"] is True and "patch" not in plain
            # Not an AdmissionReview: 400, not a traceback.
            ctx = ssl.create_default_context(cadata=cp.ca.root_pem)
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    f"https://127.0.0.1:{cp.webhook_port}/inject", data=b"{", ssl=ctx
                ) as r,
            ):
                assert r.status == 400
            assert cp.webhook is not None and cp.webhook.injected == 1


async def kube_client(api: FakeKubeApi, tmp_path: Path, name: str) -> KubeClient:
    path = tmp_path / f"kubeconfig-{name}"
    path.write_text(api.kubeconfig())
    return KubeClient(from_kubeconfig(str(path)))


async def test_two_patchers_racing_converge(tmp_path: Path) -> None:
    root = in_memory_authority("cluster.local").root_pem
    async with FakeKubeApi() as api:
        api.put(webhook_configuration("c3RhbGU="))  # someone else's bundle
        async with (
            await kube_client(api, tmp_path, "a") as client_a,
            await kube_client(api, tmp_path, "b") as client_b,
        ):
            fast = {"fast_delay": 0.01, "slow_delay": 0.1}
            a = CaBundlePatcher(client_a, root, NAME, retry=ConflictRetry(**fast))
            b = CaBundlePatcher(client_b, root, NAME, retry=ConflictRetry(**fast))
            for round_ in range(3):
                # Both read the same version before either writes: a real race, every time.
                api.hold_gets = 2
                outcomes = await asyncio.gather(a.sync(), b.sync())
                assert sorted(o.value for o in outcomes) == ["up-to-date", "updated"], outcomes
                assert api.updates == round_ + 1  # exactly one write per round: no fighting
                assert api.conflicts == round_ + 1  # the loser got 409, re-read, found it done
                stored = api.objects["mutatingwebhookconfigurations"][("", NAME)]
                assert {w["clientConfig"]["caBundle"] for w in stored["webhooks"]} == {
                    ca_bundle(root)
                }
                # Someone resets the bundle (re-applying the manifest): the next sync fixes it.
                stored = json.loads(json.dumps(stored))
                for w in stored["webhooks"]:
                    w["clientConfig"]["caBundle"] = ""
                api.put(stored)
            assert a.conflicts + b.conflicts == 3


async def test_not_found_is_not_retried(tmp_path: Path) -> None:
    root = in_memory_authority("cluster.local").root_pem
    async with FakeKubeApi() as api:
        async with await kube_client(api, tmp_path, "a") as client:
            patcher = CaBundlePatcher(client, root, NAME)
            assert await patcher.sync() is Outcome.NOT_FOUND
        assert [r for r in api.requests if NAME in r] == [
            f"GET mutatingwebhookconfigurations {NAME}"
        ]


def test_conflict_delays_are_fast_then_slow() -> None:
    import random

    retry = ConflictRetry(fast=3, fast_delay=0.05, slow_delay=5.0, jitter=0.5, rng=random.Random(1))
    delays = [retry.next_delay() for _ in range(6)]
    assert all(0.025 <= d <= 0.075 for d in delays[:3]), delays
    assert all(2.5 <= d <= 7.5 for d in delays[3:]), delays
    retry.reset()
    assert retry.next_delay() <= 0.075


async def test_other_errors_end_the_round() -> None:
    """Anything but a conflict (here 401) ends the round at once: the periodic resync tries
    again later, instead of hammering the API server."""
    root = in_memory_authority("cluster.local").root_pem
    async with FakeKubeApi() as api:
        api.put(webhook_configuration())
        async with KubeClient(KubeConfig(server=api.url, token="wrong")) as client:
            assert await CaBundlePatcher(client, root, NAME).sync() is Outcome.FAILED
        assert api.updates == 0


async def test_two_control_plane_replicas_write_the_bundle_once(tmp_path: Path) -> None:
    """Two replicas sharing a root (one state dir) start together against the same API
    server: the configuration ends with their root, written once, and stays so."""
    async with FakeKubeApi() as api:
        api.put(webhook_configuration())
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig())
        api.hold_gets = 2  # both replicas read before either writes
        replicas = [
            ControlPlane(
                ControlPlaneOptions(
                    kubernetes=True,
                    kubeconfig=str(kubeconfig),
                    xds_address="127.0.0.1:0",
                    http_address="127.0.0.1:0",
                    state_dir=str(tmp_path / "state"),
                    webhook_address="127.0.0.1:0",
                    webhook_config_name=NAME,
                    id=name,
                )
            )
            for name in ("istiod-a", "istiod-b")
        ]
        try:
            for cp in replicas:  # the first one's GET is held until the second one asks
                await cp.start()
            assert replicas[0].ca is not None and replicas[1].ca is not None
            assert replicas[0].ca.root_pem == replicas[1].ca.root_pem
            want = ca_bundle(replicas[0].ca.root_pem)

            def outcomes() -> list[Outcome | None]:
                return [cp.ca_bundle_patcher.last for cp in replicas if cp.ca_bundle_patcher]

            await eventually(lambda: None not in outcomes(), what="both replicas synced")
            assert sorted(o.value for o in outcomes() if o) == ["up-to-date", "updated"]
            assert api.updates == 1 and api.conflicts == 1
            stored = api.objects["mutatingwebhookconfigurations"][("", NAME)]
            assert {w["clientConfig"]["caBundle"] for w in stored["webhooks"]} == {want}
            # Either replica's webhook is trusted through that one bundle.
            for cp in replicas:
                answer = await call_webhook(cp.webhook_port, want, admission_review("x"))
                assert answer["response"]["allowed"] is True
        finally:
            for cp in replicas:
                await cp.close(0.5)
