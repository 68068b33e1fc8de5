"""The injection webhook's HTTPS server (aiohttp): POST /inject with an AdmissionReview.

A thin adapter around `review.review_response`. The API server only calls webhooks over TLS;
the serving certificate comes from our own CA and is renewed at half its lifetime
(control/ca/serving.py), and the CA-bundle patcher (control/webhook/cabundle.py) puts that CA's
root into the MutatingWebhookConfiguration so the API server trusts it.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Callable

from aiohttp import web

from control.httpserve import AppServer
from control.webhook.review import NamespaceLabels, ReviewError, review_response
from control.webhook.template import SidecarTemplate
from control.webhook.values import InjectionValues

logger = logging.getLogger(__name__)

INJECT_PATH = "/inject"
# Pods with many containers and big env blocks stay well below this.
MAX_BODY = 4 << 20


class WebhookServer:
    """`async with WebhookServer(...)` or start(address, ssl_context) / close()."""

    def __init__(
        self,
        template: SidecarTemplate,
        namespace_labels: NamespaceLabels,
        values: InjectionValues = InjectionValues(),
        on_result: Callable[[str], None] | None = None,
    ) -> None:
        """`on_result`: told "request" for every review, then "success", "skip" or
        "failure" (Istio's sidecar_injection_* counters)."""
        self.template = template
        self._on_result = on_result or (lambda _: None)
        self.namespace_labels = namespace_labels
        self.values = values
        self.reviews = 0
        self.injected = 0
        self._server = AppServer()

    async def start(self, address: str, ssl_context: ssl.SSLContext) -> int:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post(INJECT_PATH, self._inject)
        return await self._server.start(app, address, ssl_context=ssl_context, shutdown_timeout=1.0)

    async def close(self) -> None:
        await self._server.close()

    async def _inject(self, request: web.Request) -> web.Response:
        self._on_result("request")
        try:
            review = json.loads(await request.read())
            answer = review_response(review, self.namespace_labels, self.template, self.values)
        except (ValueError, ReviewError) as e:
            self._on_result("failure")
            # ValueError covers bad JSON; the API server logs the body of a 400.
            return web.json_response({"error": f"not an AdmissionReview v1: {e}"}, status=400)
        self.reviews += 1
        if "patch" in answer["response"]:
            self.injected += 1
            self._on_result("success")
        elif answer["response"].get("allowed"):
            self._on_result("skip")
        else:
            self._on_result("failure")
        return web.json_response(answer)
