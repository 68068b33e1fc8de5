"""AdmissionReview v1 in, AdmissionReview v1 out (sans-IO): the webhook's protocol.

The API server POSTs `{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
"request": {"uid", "kind", "namespace", "operation", "object", ...}}` and expects the same
apiVersion/kind back with `response.uid` equal to the request's, `allowed`, and for a mutation
`patchType: JSONPatch` with the patch base64-encoded. A pod we do not inject is allowed
unchanged; a pod that asks for injection with unusable annotations is refused with the reason
(it would otherwise start without its sidecar, or with a crashing init container).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from control.webhook.inject import injection_patch
from control.webhook.template import SidecarTemplate
from control.webhook.values import InjectionError, InjectionValues

logger = logging.getLogger(__name__)

API_VERSION = "admission.k8s.io/v1"
NamespaceLabels = Callable[[str], Mapping[str, str] | None]


class ReviewError(ValueError):
    """The body is not an AdmissionReview v1 request (answered with HTTP 400)."""


def review_response(
    review: object,
    namespace_labels: NamespaceLabels,
    template: SidecarTemplate,
    values: InjectionValues = InjectionValues(),
) -> dict[str, Any]:
    if not isinstance(review, Mapping):
        raise ReviewError("expected a JSON object")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
        raise ReviewError(f"expected apiVersion {API_VERSION} kind AdmissionReview")
    request = review.get("request")
    if not isinstance(request, Mapping) or not request.get("uid"):
        raise ReviewError("AdmissionReview without request.uid")
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    pod = request.get("object")
    kind = (request.get("kind") or {}).get("kind")
    if kind == "Pod" and isinstance(pod, Mapping) and request.get("operation") == "CREATE":
        # Pods made by a controller have no name yet and may lack metadata.namespace: the
        # request's namespace is the one they are created in.
        namespace = str(request.get("namespace") or "default")
        meta = dict(pod.get("metadata") or {})
        meta.setdefault("namespace", namespace)
        pod = {**pod, "metadata": meta}
        name = meta.get("name") or meta.get("generateName") or "?"
        try:
            decision, patch = injection_patch(pod, namespace_labels(namespace), template, values)
        except InjectionError as e:
            logger.info("refusing pod %s/%s: %s", namespace, name, e)
            response["allowed"] = False
            response["status"] = {"code": 400, "reason": "BadRequest", "message": str(e)}
        else:
            logger.debug("pod %s/%s: %s", namespace, name, decision.reason)
            if patch:
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}
