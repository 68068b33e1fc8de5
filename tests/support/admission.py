"""AdmissionReviews sent to a running control plane's injection webhook as the API server
sends them (HTTPS, verified against the mesh root for istiod.istio-system.svc)."""

from __future__ import annotations

import ssl
from typing import Any

import aiohttp

from control.app import ControlPlane


async def admission_review(
    cp: ControlPlane, obj: dict[str, Any], namespace: str = "shop", uid: str = "5f1e0c4a-review"
) -> dict[str, Any]:
    """POST one AdmissionReview for Pod `obj`; the `response` part of the answer."""
    assert cp.ca is not None and cp.webhook_port
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "object": obj,
        },
    }
    ctx = ssl.create_default_context(cadata=cp.ca.root_pem)
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"https://127.0.0.1:{cp.webhook_port}/inject",
            json=body,
            ssl=ctx,
            server_hostname="istiod.istio-system.svc",
        ) as r,
    ):
        assert r.status == 200, await r.text()
        answer: dict[str, Any] = await r.json()
    response: dict[str, Any] = answer["response"]
    assert response["uid"] == uid
    return response
