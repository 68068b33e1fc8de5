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

import logging
from collections.abc import Iterable

import grpc

from control import heap
from control.ca.authn import TokenIssuer
from control.ca.authority import CertificateAuthority
from control.ca.service import CertificateService
from control.ca.serving import ServingCertificates
from control.config.source import ConfigSource
from control.debug import DebugServer
from control.debugaccess import debug_middleware, debug_policy
from control.gcsettings import YoungThreshold
from control.inputs import config_source, mesh_source
from control.kube.rootcert import RootCertPublisher
from control.metrics import Metrics
from control.model.index import MeshIndex
from control.model.proxy import Proxy
from control.options import ControlPlaneOptions
from control.pipeline import CurrentPush, PushPipeline, PushRecord
from control.registry.autoregister import WorkloadRegistry
from control.registry.keeper import WorkloadKeeper
from control.secretaccess import SecretGuard
from control.security import SecurityStack
from control.ui.sources import DashboardInputs, dashboard_routes
from control.webhook.cabundle import CaBundlePatcher
from control.webhook.injector import Injector, InjectorOptions
from control.webhook.server import WebhookServer
from control.webhook.values import InjectionValues
from control.xds.cache import ResourceCache, ResourceSet
from control.xds.options import XdsOptions, grpc_connection_options, grpc_stream_options
from control.xds.server import XdsServer
from control.xds.views import StreamViews
from pilotfish_common.grpcserver import stop_bounded
from pilotfish_common.lifecycle import Lifecycle, close_each
from protos import typeurls

# ControlPlaneOptions lives in control/options.py; it is imported from here too.
__all__ = ["ControlPlane", "ControlPlaneOptions"]

logger = logging.getLogger(__name__)


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
        self.watcher: ConfigSource = config_source(options, self.metrics)
        self.mesh = mesh_source(options, self.watcher)
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
        self.injector = Injector(
            options=InjectorOptions(
                address=options.webhook_address,
                template=options.injection_template,
                values=InjectionValues(
                    options.injection_image,
                    options.injection_pilot_address,
                    native_sidecars=options.injection_native_sidecars,
                    revision=options.revision,
                ),
                config_name=options.webhook_config_name,
            ),
            mesh=self.mesh,
            namespace_labels=self.watcher.namespace_labels,
            metrics=self.metrics,
            ssl_context=self.security.webhook_ssl_context,
            root_pem=lambda: self.security.ca.root_pem if self.security.ca is not None else None,
            kube=self.watcher.kube_client,
        )
        self.ui = (
            dashboard_routes(
                DashboardInputs(
                    proxies=lambda: (c.proxy for c in self.xds.connections.values()),
                    syncz=self.views.syncz,
                    config=self.watcher,
                    index=lambda: self.current.index,
                    kube_client=lambda: self.watcher.kube_client,
                    xds_port=lambda: self.xds_port,
                ),
                prometheus_url=options.prometheus_url,
                kubernetes=options.kubernetes,
                replica_id=options.id,
            )
            if options.ui
            else None
        )
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
        self._gc = YoungThreshold(options.gc_young_threshold)
        self._grpc: grpc.aio.Server | None = None
        self.root_cert_publisher: RootCertPublisher | None = None
        self.xds_port = 0
        self.secure_xds_port = 0
        self.mtls_xds_port = 0
        self.http_port = 0
        self.ready = False

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        # Before the first config is read: loading and indexing it allocate as pushes do.
        self._gc.apply()
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
        await self.injector.start()
        client = self.watcher.kube_client
        if client is not None and self.security.ca is not None:
            self.root_cert_publisher = RootCertPublisher(
                client,
                self.security.ca.root_pem,
                excluded=self.options.root_cert_excluded_namespaces,
            )
            await self.root_cert_publisher.start()
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

    async def close(self, grace: float = 1.0) -> None:
        """Stop in the reverse order of start(): nothing new arrives (HTTP, webhook, pushes,
        streams) before what serves it goes (certificates, CA, config)."""
        self.ready = False
        await close_each(
            self.debug, self.ui, self.root_cert_publisher, self.injector, self.keeper, self.pipeline
        )
        if self._grpc is not None:
            await stop_bounded(self._grpc, grace)
            self._grpc = None
        await close_each(self.xds, self.security, self.mesh, self.watcher)
        self._gc.restore()

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
    def webhook(self) -> WebhookServer | None:
        return self.injector.server

    @property
    def webhook_port(self) -> int:
        return self.injector.port

    @property
    def ca_bundle_patcher(self) -> CaBundlePatcher | None:
        return self.injector.ca_bundle_patcher

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

    def push_now(self, reasons: Iterable[str] = ("manual",), waited: float = 0.0) -> int:
        """PushPipeline.push_now: rebuild and push at once, skipping the debounce."""
        return self.pipeline.push_now(reasons, waited)


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
