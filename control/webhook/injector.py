"""The sidecar injector as one part of the control plane: the template it loads, the values
it injects (the flags', then the mesh config's defaultConfig as it changes), the HTTPS server,
Istio's sidecar_injection_* counters, and, in Kubernetes mode, the MutatingWebhookConfiguration
whose caBundle is kept equal to our root.

The control plane hands it what it needs from other parts as callables (the webhook's TLS
context, the CA root) so it holds none of them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from control.config.source import MeshConfigSource
from control.kube.client import KubeClient
from control.metrics import Metrics
from control.model.meshconfig import MeshSettings
from control.webhook.cabundle import CaBundlePatcher
from control.webhook.review import NamespaceLabels
from control.webhook.server import WebhookServer
from control.webhook.template import DEFAULT_TEMPLATE, load_template
from control.webhook.values import InjectionValues
from pilotfish_common.lifecycle import Lifecycle, close_each

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class InjectorOptions:
    address: str = ""  # "" = no webhook server
    template: str = ""  # "" = control/webhook/agent-sidecar.yaml
    values: InjectionValues = field(default_factory=InjectionValues)  # the flags' values
    # Kubernetes mode: the MutatingWebhookConfiguration whose caBundle we patch ("" = none).
    config_name: str = ""


@dataclass(eq=False, kw_only=True)
class Injector(Lifecycle):
    """`start()` after the security stack has started (the TLS context and root exist);
    `port` is the webhook's bound port (0 when not served)."""

    options: InjectorOptions
    mesh: MeshConfigSource
    namespace_labels: NamespaceLabels
    metrics: Metrics
    ssl_context: Callable[[str], Awaitable[ssl.SSLContext]]
    root_pem: Callable[[], str | None]
    kube: KubeClient | None
    server: WebhookServer | None = field(default=None, init=False)
    ca_bundle_patcher: CaBundlePatcher | None = field(default=None, init=False)
    port: int = field(default=0, init=False)

    async def start(self) -> None:
        o = self.options
        if o.address:
            template = await asyncio.to_thread(load_template, o.template or DEFAULT_TEMPLATE)
            context = await self.ssl_context(o.address)
            values = injection_values(o.values, self.mesh.current)
            server = self.server = WebhookServer(
                template, self.namespace_labels, values, self._count
            )
            self.mesh.subscribe(lambda mesh: _follow(server, mesh))
            try:
                self.port = await server.start(o.address, context)
            except OSError as e:
                raise OSError(f"cannot listen on --webhook-address {o.address}: {e}") from None
            host, _, _ = o.address.rpartition(":")
            logger.info("sidecar injection webhook on https://%s:%d/inject", host, self.port)
        root = self.root_pem()
        if o.config_name and self.kube is not None and root is not None:
            self.ca_bundle_patcher = CaBundlePatcher(self.kube, root, o.config_name)
            await self.ca_bundle_patcher.start()

    async def close(self) -> None:
        await close_each(self.ca_bundle_patcher, self.server)

    def _count(self, result: str) -> None:
        m = self.metrics
        counters = {
            "request": m.injection_requests,
            "success": m.injection_success,
            "skip": m.injection_skip,
            "failure": m.injection_failure,
        }
        counters[result].inc()


def injection_values(values: InjectionValues, mesh: MeshSettings) -> InjectionValues:
    """The injector's values with the mesh config's defaultConfig (flags already applied)."""
    proxy = mesh.default_config
    return dataclasses.replace(
        values,
        hold_application_until_proxy_starts=proxy.hold_application_until_proxy_starts,
        proxy_metadata=proxy.proxy_metadata,
        drain_duration=proxy.drain_duration,
    )


def _follow(server: WebhookServer, mesh: MeshSettings) -> None:
    server.values = injection_values(server.values, mesh)
