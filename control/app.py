"""The control plane, wired: which parts exist, what each is handed, and the order in which
they start and stop. `__main__` turns flags into `ControlPlaneOptions` and runs this.

One push reads in one direction: the config source hands a new config to the push pipeline
(control/pipeline.py), which rebuilds the mesh index and marks the xDS server's streams; the
server's send workers pull the generated resources from the pipeline's `CurrentPush`.
Connected proxies reach the workload keeper (control/registry/keeper.py) through the server's
hooks, and the keeper tells the pipeline that workloads changed. Security (CA, tokens,
serving certificates: control/security.py) and the debug views (control/debug.py,
control/xds/views.py) are handed in from here; none of them holds the control plane.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import grpc

from control import heap
from control.ca.authn import TokenIssuer
from control.ca.authority import SERVING_VALIDITY, CertificateAuthority
from control.ca.service import CertificateService
from control.ca.serving import ServingCertificates
from control.config.meshwatch import EffectiveMeshConfig, MeshConfigFile, MeshInput
from control.config.source import ConfigSource
from control.config.watcher import ConfigWatcher
from control.debug import DebugServer
from control.debugaccess import DebugAllow, debug_middleware, debug_policy, own_namespace
from control.gatewayapi import status as gateway_status
from control.kube.client import kube_config
from control.kube.meshconfig import KubeMeshConfig
from control.kube.rootcert import DEFAULT_EXCLUDED, RootCertPublisher
from control.kube.source import KubeSource
from control.metrics import Metrics
from control.model.gatewayapi import GROUP as GATEWAY_API_GROUP
from control.model.index import MeshIndex
from control.model.meshconfig import MeshOverrides, MeshSettings
from control.model.proxy import Proxy
from control.pipeline import CurrentPush, PushPipeline, PushRecord
from control.registry.autoregister import WorkloadRegistry
from control.registry.keeper import WorkloadKeeper
from control.secretaccess import SecretGuard
from control.security import SecurityOptions, SecurityStack
from control.ui.dashboard import Dashboard, MetricsSource
from control.ui.promapi import PrometheusSource
from control.ui.replicas import DEFAULT_SELECTOR, ReplicaRows, kube_replicas
from control.ui.routes import UiRoutes
from control.ui.scrape import AgentScraper, scrape_targets
from control.webhook.cabundle import CaBundlePatcher
from control.webhook.inject import InjectionValues
from control.webhook.server import WebhookServer
from control.webhook.template import DEFAULT_TEMPLATE, load_template
from control.xds.cache import ResourceCache, ResourceSet
from control.xds.options import XdsOptions, grpc_connection_options, grpc_stream_options
from control.xds.server import XdsServer
from control.xds.views import StreamViews
from pilotfish_common.lifecycle import Lifecycle
from protos import typeurls

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ControlPlaneOptions:
    config_paths: tuple[str, ...] = ()
    xds_address: str = "127.0.0.1:15010"
    # TLS gRPC (ADS + CA) with a serving certificate from our own CA; "" = not served. The
    # CLI default is 127.0.0.1:15012; here it is off so that library users and tests do not
    # collide on a fixed port.
    secure_xds_address: str = ""
    # TLS gRPC that requires a client certificate issued by our CA ("" = not served). A
    # separate listener because grpcio can only either not ask for a client certificate or
    # require one; the token port must not require one (an agent has no cert before its
    # first CreateCertificate).
    mtls_xds_address: str = ""
    http_address: str = "127.0.0.1:15014"
    # Empty: nothing is persisted (tests): the CA root and the token key then live in memory
    # for the life of the process.
    state_dir: str = ""
    ca_cert: str = ""  # plugged-in CA: signing certificate (root or intermediate) ...
    ca_key: str = ""  # ... its key ...
    ca_chain: str = ""  # ... and the certificates above it, root last
    max_workload_cert_ttl: float = 24 * 3600.0
    # Lifetime of the control plane's own TLS certificates (TLS gRPC ports, webhook), seconds;
    # each is issued again at half its lifetime (control/ca/serving.py).
    serving_cert_ttl: float = SERVING_VALIDITY.total_seconds()
    trust_domain: str = "cluster.local"
    # Mesh-wide ALLOW_ANY | REGISTRY_ONLY for REDIRECT proxies (a Sidecar may override it).
    outbound_traffic_policy: str = "ALLOW_ANY"
    id: str = "pilotfish"
    debounce_quiet: float = 0.1
    debounce_max: float = 10.0
    workload_grace: float = 10.0
    config_poll_interval: float = 0.25
    # Files must be quiet this long before they are re-read (a writer may still be writing).
    config_settle: float = 0.05
    # Config from the Kubernetes API instead of files: in-cluster credentials, or the
    # kubeconfig file given (control/kube/). Pods are the workloads; proxies do not
    # auto-register.
    kubernetes: bool = False
    kubeconfig: str = ""
    # Sidecar injection webhook (HTTPS, certificate from our CA); "" = not served. The CLI
    # default is 127.0.0.1:15017; the Kubernetes manifests serve it on 0.0.0.0:15017.
    webhook_address: str = ""
    injection_template: str = ""  # "" = control/webhook/agent-sidecar.yaml
    injection_image: str = ""  # "" = the template's image
    injection_pilot_address: str = ""  # "" = the template's PILOT_ADDRESS
    injection_hold_application: bool = False  # defaultConfig.holdApplicationUntilProxyStarts
    injection_native_sidecars: bool = False  # Istio's ENABLE_NATIVE_SIDECARS
    # Istio-style revision ("" = the default): injects only its pods (webhook/inject.py).
    revision: str = ""
    # Kubernetes mode: the MutatingWebhookConfiguration whose caBundle we keep equal to our
    # root ("" = not patched).
    webhook_config_name: str = ""
    # Kubernetes mode: namespaces that get no istio-ca-root-cert ConfigMap (Istio's system
    # namespaces by default).
    root_cert_excluded_namespaces: frozenset[str] = DEFAULT_EXCLUDED
    # --debug-allow: who may read /debug/* off loopback and all of syncz over TLS xDS (None:
    # the control plane's own namespace); whether /debug/* needs that (None: judged by
    # http_address, loopback is open; tests force it).
    debug_allow: DebugAllow | None = None
    debug_requires_auth: bool | None = None
    # The dashboard at /ui/ (--ui); where its graph reads metrics: a Prometheus (its HTTP API)
    # or, "", the connected agents' status ports, scraped by the control plane itself.
    ui: bool = True
    prometheus_url: str = ""
    xds: XdsOptions = field(default_factory=XdsOptions)
    # Istio MeshConfig YAML ("" = none; Kubernetes mode also reads the ConfigMap `istio`).
    mesh_config: str = ""
    # Which options were given as flags and so win over the mesh config (names of the
    # fields above: outbound_traffic_policy, injection_hold_application). None: every one
    # that differs from its default (library use).
    flags_given: frozenset[str] | None = None

    def mesh_overrides(self) -> MeshOverrides:
        """What the mesh config may not change. The trust domain is always the one the
        process starts with (__main__ takes it from the mesh file when no flag says):
        certificates and SPIFFE identities are issued under it."""
        given = self.flags_given
        if given is None:
            defaults = ControlPlaneOptions()
            given = frozenset(
                name
                for name in ("outbound_traffic_policy", "injection_hold_application")
                if getattr(self, name) != getattr(defaults, name)
            )
        return MeshOverrides(
            trust_domain=self.trust_domain,
            outbound_traffic_policy=self.outbound_traffic_policy
            if "outbound_traffic_policy" in given
            else None,
            hold_application_until_proxy_starts=True
            if "injection_hold_application" in given and self.injection_hold_application
            else None,
        )

    def security(self) -> SecurityOptions:
        return SecurityOptions(
            trust_domain=self.trust_domain,
            state_dir=self.state_dir,
            ca_cert=self.ca_cert,
            ca_key=self.ca_key,
            ca_chain=self.ca_chain,
            max_workload_cert_ttl=self.max_workload_cert_ttl,
            serving_cert_ttl=self.serving_cert_ttl,
            secure_address=self.secure_xds_address,
            mtls_address=self.mtls_xds_address,
            replica_id=self.id,
            revision=self.revision,
        )


class ControlPlane(Lifecycle):
    """Owns every long-lived part of the control plane; use `async with ControlPlane(opts)`.

    The read-only properties below are for tests, benchmarks and pilotfish-ctl, which reach
    into a running control plane; the parts themselves never use them."""

    def __init__(self, options: ControlPlaneOptions, metrics: Metrics | None = None) -> None:
        self.options = options
        self.metrics = metrics or Metrics()
        self.cache = ResourceCache()
        self.registry = WorkloadRegistry(
            grace=options.workload_grace,
            on_refused=lambda reason: self.metrics.registrations_refused.labels(reason).inc(),
        )
        # KubeConfigError: bad kubeconfig
        self.watcher: ConfigSource = _config_source(options, self._kube_events)
        self.mesh = _mesh_source(options, self.watcher)
        access = debug_policy(options)  # who may read the debug views
        self.security = SecurityStack(options.security(), self.metrics, self.watcher.kube_client)
        self.keeper = WorkloadKeeper(
            self.registry,
            state_dir=options.state_dir,
            register=not options.kubernetes,  # Kubernetes: pods come from the API server
        )
        self.current = CurrentPush(
            self.cache,
            self.metrics,
            trust_domain=options.trust_domain,
            outbound_traffic_policy=options.outbound_traffic_policy,
        )
        self.xds = XdsServer(
            self.current,
            self.metrics,
            options.xds,
            on_connect=self.keeper.proxy_connected,
            on_disconnect=self.keeper.proxy_disconnected,
            on_health=self.keeper.proxy_health,
            authorize=self.security.authorize_stream,
            trim=heap.malloc_trim(),
            syncz_filter=access.visible_syncz,
            # Gateway certificates: only a router of the Secret's namespace may subscribe.
            guards={typeurls.SECRET: SecretGuard(lambda: self.current.index)},
        )
        self.pipeline = PushPipeline(
            self.watcher,
            self.keeper,
            self.current,
            self.xds,
            self.metrics,
            quiet=options.debounce_quiet,
            max_delay=options.debounce_max,
            mesh=self.mesh,
        )
        self.views = StreamViews(self.xds, options.xds.control_plane_id)
        self.ui = _dashboard(self) if options.ui else None
        self.debug = DebugServer(
            ready=lambda: self.ready,
            metrics=self.metrics.render,
            streams=self.views,
            config=self.watcher,
            pushes=self.pipeline,
            resources=self.current.resources,
            registered=self.registry.workload_entries,
            access=debug_middleware(access, lambda: self.security.call_auth),
            mesh=self.mesh.status,
            routes=(self.ui.add_to,) if self.ui is not None else (),
        )
        self._grpc: grpc.aio.Server | None = None
        self.webhook: WebhookServer | None = None
        self.ca_bundle_patcher: CaBundlePatcher | None = None
        self.root_cert_publisher: RootCertPublisher | None = None
        self.xds_port = 0
        self.secure_xds_port = 0
        self.mtls_xds_port = 0
        self.http_port = 0
        self.webhook_port = 0
        self.ready = False

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        await self.watcher.start()  # raises ConfigError on a bad file at startup
        await self.mesh.start()  # the same for --mesh-config
        # Restored workloads are in the first snapshot: no gap in EDS across a restart.
        await self.keeper.start()
        await self.pipeline.start()
        await self.security.start()
        server = _grpc_server(self.options.xds)
        self.xds.add_to(server)
        self.security.add_to(server)
        self.xds_port = server.add_insecure_port(self.options.xds_address)
        if self.xds_port == 0:
            raise OSError(f"cannot listen on --xds-address {self.options.xds_address}")
        self.secure_xds_port, self.mtls_xds_port = await self.security.add_tls_ports(server)
        await server.start()
        self._grpc = server
        await self._start_webhook()
        if self.ui is not None:
            await self.ui.start()
        self.http_port = await self.debug.start(self.options.http_address)
        self.ready = True
        logger.info(
            "control plane %s ready: xds %s, secure xds %s, http %s",
            self.options.id,
            _with_port(self.options.xds_address, self.xds_port),
            _with_port(self.options.secure_xds_address, self.secure_xds_port)
            if self.secure_xds_port
            else "off",
            _with_port(self.options.http_address, self.http_port),
        )

    async def _start_webhook(self) -> None:
        o = self.options
        if o.webhook_address:
            template = await asyncio.to_thread(
                load_template, o.injection_template or DEFAULT_TEMPLATE
            )
            context = await self.security.webhook_ssl_context(o.webhook_address)
            values = _injection_values(
                InjectionValues(
                    o.injection_image,
                    o.injection_pilot_address,
                    native_sidecars=o.injection_native_sidecars,
                    revision=o.revision,
                ),
                self.mesh.current,
            )
            webhook = self.webhook = WebhookServer(
                template, self.watcher.namespace_labels, values, self._injection_result
            )
            self.mesh.subscribe(lambda mesh: _injection_follows(webhook, mesh))
            try:
                self.webhook_port = await self.webhook.start(o.webhook_address, context)
            except OSError as e:
                raise OSError(
                    f"cannot listen on --webhook-address {o.webhook_address}: {e}"
                ) from None
            logger.info(
                "sidecar injection webhook on https://%s/inject",
                _with_port(o.webhook_address, self.webhook_port),
            )
        client = self.watcher.kube_client
        if o.webhook_config_name and client is not None and self.security.ca is not None:
            self.ca_bundle_patcher = CaBundlePatcher(
                client, self.security.ca.root_pem, o.webhook_config_name
            )
            await self.ca_bundle_patcher.start()
        if client is not None and self.security.ca is not None:
            self.root_cert_publisher = RootCertPublisher(
                client, self.security.ca.root_pem, excluded=o.root_cert_excluded_namespaces
            )
            await self.root_cert_publisher.start()

    async def close(self, grace: float = 1.0) -> None:
        """Stop in the reverse order of start(): nothing new arrives (HTTP, webhook, pushes,
        streams) before what serves it goes (certificates, CA, config)."""
        self.ready = False
        await self.debug.close()
        if self.ui is not None:
            await self.ui.close()
        if self.ca_bundle_patcher is not None:
            await self.ca_bundle_patcher.close()
        if self.root_cert_publisher is not None:
            await self.root_cert_publisher.close()
        if self.webhook is not None:
            await self.webhook.close()
        await self.keeper.close()
        await self.pipeline.close()
        if self._grpc is not None:
            try:
                # Bounded: shutdown must not hang on a stream that will not finish.
                async with asyncio.timeout(grace + 5.0):
                    await self._grpc.stop(grace)
            except TimeoutError:
                logger.warning("gRPC server did not stop within %.1fs", grace + 5.0)
            self._grpc = None
        await self.xds.close()
        await self.security.close()
        await self.mesh.close()
        await self.watcher.close()

    # --- for tests, benchmarks and pilotfish-ctl -------------------------------------------

    @property
    def ca(self) -> CertificateAuthority | None:
        return self.security.ca

    @property
    def tokens(self) -> TokenIssuer | None:
        """The token issuer (tests and pilotfish-ctl mint tokens with the same key)."""
        return self.security.tokens

    @property
    def ca_service(self) -> CertificateService | None:
        """The CA's gRPC service and its signing worker (set by start())."""
        return self.security.ca_service

    @property
    def serving(self) -> ServingCertificates | None:
        """The TLS gRPC ports' serving certificates."""
        return self.security.serving

    @property
    def webhook_serving(self) -> ServingCertificates | None:
        return self.security.webhook_serving

    @property
    def index(self) -> MeshIndex:
        return self.current.index

    @property
    def pushes(self) -> int:
        return self.pipeline.pushes

    @property
    def push_log(self) -> Iterable[PushRecord]:
        return self.pipeline.push_log

    def resources(self, proxy: Proxy, type_urls: Iterable[str]) -> dict[str, ResourceSet]:
        return self.current.resources(proxy, type_urls)

    def _injection_result(self, result: str) -> None:
        m = self.metrics
        counters = {
            "request": m.injection_requests,
            "success": m.injection_success,
            "skip": m.injection_skip,
            "failure": m.injection_failure,
        }
        counters[result].inc()

    def _kube_events(self, source: str, kind: str, event: str, n: int) -> None:
        counter = (
            self.metrics.k8s_reg_events if source == "registry" else self.metrics.k8s_cfg_events
        )
        counter.labels(kind, event).inc(n)

    def push_now(self, reasons: Iterable[str] = ("manual",), waited: float = 0.0) -> int:
        """PushPipeline.push_now: rebuild and push at once, skipping the debounce."""
        return self.pipeline.push_now(reasons, waited)


def _dashboard(cp: ControlPlane) -> UiRoutes:
    """/ui/: metrics from --prometheus-url, or scraped from the connected agents."""
    url = cp.options.prometheus_url
    source: MetricsSource
    if url:
        source = PrometheusSource(url)
    else:
        source = AgentScraper(
            lambda: scrape_targets(
                (c.proxy.type, c.proxy.ip, c.proxy.status_port) for c in cp.xds.connections.values()
            )
        )
    remote = None
    if cp.options.kubernetes:
        # Every replica's streams, as pilotfish-ctl proxy-status finds them: the
        # control-plane pods of this namespace, asked on the plaintext xDS port they share.
        find = kube_replicas(
            lambda: cp.watcher.kube_client,
            own_namespace(True, os.environ),
            DEFAULT_SELECTOR,
            lambda: cp.xds_port,
        )
        remote = ReplicaRows(find, cp.options.id)
    dashboard = Dashboard(
        source,
        syncz=cp.views.syncz,
        config=cp.watcher,
        index=lambda: cp.current.index,
        remote_rows=remote,
        statuses=lambda config: [
            {**gateway_status.as_json(s), "group": GATEWAY_API_GROUP}
            for s in config.gateway_api_status
        ],
    )
    return UiRoutes(dashboard)


def _config_source(
    options: ControlPlaneOptions, on_events: Callable[[str, str, str, int], None]
) -> ConfigSource:
    if options.kubernetes:
        return KubeSource(
            kube_config(options.kubeconfig),
            domain=options.trust_domain,
            on_events=on_events,
            revision=options.revision,
        )
    return ConfigWatcher(
        list(options.config_paths),
        debounce=options.config_settle,
        poll_interval=options.config_poll_interval,
        domain=options.trust_domain,
        revision=options.revision,
    )


def _mesh_source(options: ControlPlaneOptions, source: ConfigSource) -> EffectiveMeshConfig:
    """The mesh config inputs, first match wins: the ConfigMap `istio` in the control
    plane's namespace (Kubernetes mode), then `--mesh-config`; flags on top."""
    inputs: list[MeshInput] = []
    client = source.kube_client
    if client is not None:
        inputs.append(KubeMeshConfig(client, own_namespace(True, os.environ)))
    if options.mesh_config:
        inputs.append(
            MeshConfigFile(
                options.mesh_config,
                poll_interval=options.config_poll_interval,
                debounce=options.config_settle,
            )
        )
    return EffectiveMeshConfig(inputs, options.mesh_overrides())


def _injection_values(values: InjectionValues, mesh: MeshSettings) -> InjectionValues:
    """The injector's values with the mesh config's defaultConfig (flags already applied)."""
    proxy = mesh.default_config
    return dataclasses.replace(
        values,
        hold_application_until_proxy_starts=proxy.hold_application_until_proxy_starts,
        proxy_metadata=proxy.proxy_metadata,
        drain_duration=proxy.drain_duration,
    )


def _injection_follows(webhook: WebhookServer, mesh: MeshSettings) -> None:
    webhook.values = _injection_values(webhook.values, mesh)


def _grpc_server(options: XdsOptions) -> grpc.aio.Server:
    """One gRPC server for ADS and the CA, on every port."""
    return grpc.aio.server(
        options=[
            *grpc_stream_options(options),
            *grpc_connection_options(),
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 256 << 20),
        ]
    )


def _with_port(address: str, port: int) -> str:
    host, _, _ = address.rpartition(":")
    return f"{host}:{port}"
