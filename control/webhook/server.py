"""The injection webhook's HTTPS server (aiohttp): POST /inject with an AdmissionReview.

A thin adapter around `review.review_response`. The API server only calls webhooks over TLS;
the serving certificate comes from our own CA (`ssl_context_for`), and the CA-bundle patcher
(control/webhook/cabundle.py) puts that CA's root into the MutatingWebhookConfiguration so the
API server trusts it.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import tempfile
from pathlib import Path

from aiohttp import web

from control.webhook.inject import InjectionValues
from control.webhook.review import NamespaceLabels, ReviewError, review_response
from control.webhook.template import SidecarTemplate

logger = logging.getLogger(__name__)

INJECT_PATH = "/inject"
# Pods with many containers and big env blocks stay well below this.
MAX_BODY = 4 << 20


def ssl_context_for(chain_pem: list[str], key_pem: bytes) -> ssl.SSLContext:
    """A server context for a PEM chain (leaf first) and key. `ssl` loads certificates only
    from files, so they pass through a private temporary directory (0700, key 0600) that is
    removed at once. Blocking: call through asyncio.to_thread."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="pilotfish-webhook-") as tmp:
        cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
        cert.write_text("".join(chain_pem))
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key_pem)
        ctx.load_cert_chain(cert, key)
    return ctx


class WebhookServer:
    """`async with WebhookServer(...)` or start(address, ssl_context) / close()."""

    def __init__(
        self,
        template: SidecarTemplate,
        namespace_labels: NamespaceLabels,
        values: InjectionValues = InjectionValues(),
    ) -> None:
        self.template = template
        self.namespace_labels = namespace_labels
        self.values = values
        self.reviews = 0
        self.injected = 0
        self._runner: web.AppRunner | None = None

    async def start(self, address: str, ssl_context: ssl.SSLContext) -> int:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post(INJECT_PATH, self._inject)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        host, _, port = address.rpartition(":")
        site = web.TCPSite(
            self._runner, host.strip("[]"), int(port), ssl_context=ssl_context, reuse_address=True
        )
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        return int(sockets[0].getsockname()[1]) if sockets else int(port)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _inject(self, request: web.Request) -> web.Response:
        try:
            review = json.loads(await request.read())
            answer = review_response(review, self.namespace_labels, self.template, self.values)
        except (ValueError, ReviewError) as e:
            # ValueError covers bad JSON; the API server logs the body of a 400.
            return web.json_response({"error": f"not an AdmissionReview v1: {e}"}, status=400)
        self.reviews += 1
        if "patch" in answer["response"]:
            self.injected += 1
        return web.json_response(answer)
