"""The control plane, wired: config source → mesh index → generators → ADS server, plus the
debug/health HTTP server. `__main__` turns flags into `ControlPlaneOptions` and runs this.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import ipaddress
import json
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from cryptography.hazmat.primitives.asymmetric import ec

from control import heap
from control.ca.authn import (
    Authenticator,
    AuthError,
    TokenIssuer,
    check_claim,
    load_or_create_token_key,
)
from control.ca.authority import (
    SERVING_VALIDITY,
    CaError,
    CaLimits,
    CertificateAuthority,
    authority_from_files,
    authority_from_state_dir,
    in_memory_authority,
)
from control.ca.grpcauth import STATUS, CallAuthenticator, is_secure
from control.ca.identity import Identity
from control.ca.service import CertificateService
from control.ca.serving import ServingCertificates
from control.config.watcher import ConfigWatcher
from control.debug import DebugServer
from control.debugaccess import DebugAllow, debug_middleware, debug_policy
from control.generate import generators_for
from control.generate.context import GenContext, next_context
from control.kube.client import kube_config
from control.kube.source import KubeSource
from control.kube.tokenreview import KubeTokenReviewer
from control.metrics import Metrics
from control.model.index import MeshIndex, endpoints_only, rules_of
from control.model.proxy import Proxy
from control.model.types import MeshConfig
from control.registry.autoregister import WorkloadRegistry
from control.webhook.cabundle import CaBundlePatcher
from control.webhook.inject import InjectionValues
from control.webhook.server import WebhookServer
from control.webhook.template import DEFAULT_TEMPLATE, load_template
from control.xds.cache import EMPTY, ResourceCache, ResourceSet
from control.xds.push import PushLoop
from control.xds.server import XdsOptions, XdsServer, grpc_stream_options
from protos.typeurls import ENDPOINT

logger = logging.getLogger(__name__)

_EDS_ONLY = frozenset((ENDPOINT,))
PUSH_LOG_SIZE = 1024


@dataclass(frozen=True, slots=True)
class PushRecord:
    """One push, for /debug/pushz: when it started (the monotonic clock is the one every
    process on the machine shares, so a load generator can line its own timings up with it),
    why, how long its changes waited in the debounce, and what it pushed to how many streams."""

    seq: int
    started: float  # time.monotonic()
    started_unix: float  # time.time()
    reasons: tuple[str, ...]
    debounce: float  # seconds from the first change it carries to its start
    eds_only: bool
    streams: int
    # File mode: time.monotonic() when the scan of the config files it carries began (every
    # file written before that is in it; ConfigWatcher.snapshot_at). None in Kubernetes mode.
    config_snapshot: float | None = None

    def as_json(self) -> dict[str, object]:
        return {
            "seq": self.seq,
            "started_monotonic": self.started,
            "started_unix": self.started_unix,
            "reasons": list(self.reasons),
            "debounce_seconds": self.debounce,
            "eds_only": self.eds_only,
            "streams": self.streams,
            "config_snapshot_monotonic": self.config_snapshot,
        }


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
    # Kubernetes mode: the MutatingWebhookConfiguration whose caBundle we keep equal to our
    # root ("" = not patched).
    webhook_config_name: str = ""
    # --debug-allow: who may read /debug/* off loopback and all of syncz over TLS xDS (None:
    # the control plane's own namespace); whether /debug/* needs that (None: judged by
    # http_address, loopback is open; tests force it).
    debug_allow: DebugAllow | None = None
    debug_requires_auth: bool | None = None
    xds: XdsOptions = field(default_factory=XdsOptions)


class ControlPlane:
    """Owns every long-lived part of the control plane; use `async with ControlPlane(opts)`."""

    def __init__(self, options: ControlPlaneOptions, metrics: Metrics | None = None) -> None:
        self.options = options
        self.metrics = metrics or Metrics()
        self.cache = ResourceCache()
        self.registry = WorkloadRegistry(grace=options.workload_grace)
        self.watcher: ConfigWatcher | KubeSource
        access = debug_policy(options)  # who may read the debug views
        if options.kubernetes:
            self.watcher = KubeSource(
                kube_config(options.kubeconfig), self._on_config, domain=options.trust_domain
            )
        else:
            self.watcher = ConfigWatcher(
                list(options.config_paths),
                self._on_config,
                debounce=options.config_settle,
                poll_interval=options.config_poll_interval,
                domain=options.trust_domain,
            )
        self.xds = XdsServer(
            self,
            self.metrics,
            options.xds,
            on_connect=self._on_proxy_connect,
            on_disconnect=self._on_proxy_disconnect,
            authorize=self._authorize_stream,
            trim=heap.malloc_trim(),
            syncz_filter=access.visible_syncz,
        )
        self.push_loop = PushLoop(
            self._push, quiet=options.debounce_quiet, max_delay=options.debounce_max
        )
        self.debug = DebugServer(self, debug_middleware(access, lambda: self._call_auth))
        self.pushes = 0
        self.push_log: collections.deque[PushRecord] = collections.deque(maxlen=PUSH_LOG_SIZE)
        self._index_version = 0
        self._ctx = GenContext(
            MeshIndex(
                MeshConfig(),
                trust_domain=options.trust_domain,
                outbound_traffic_policy=options.outbound_traffic_policy,
            ),
            self.cache,
        )
        self._push_started = time.monotonic()
        self._grpc: grpc.aio.Server | None = None
        self._expiry_task: asyncio.Task[None] | None = None
        self._expiry_wake = asyncio.Event()
        self._save_task: asyncio.Task[None] | None = None
        self._save_wake = asyncio.Event()
        self.xds_port = 0
        self.secure_xds_port = 0
        self.mtls_xds_port = 0
        self.http_port = 0
        self.ready = False
        # Set by start(): the CA, the token issuer (tests and pilotfish-ctl mint tokens with
        # the same key), and the serving certificate chain of the TLS ports.
        self.ca: CertificateAuthority | None = None
        self.tokens: TokenIssuer | None = None
        self._call_auth: CallAuthenticator | None = None
        self._ca_service: CertificateService | None = None
        self.serving: ServingCertificates | None = None  # the TLS gRPC ports'
        self.webhook_serving: ServingCertificates | None = None
        self.webhook: WebhookServer | None = None
        self.webhook_port = 0
        self.ca_bundle_patcher: CaBundlePatcher | None = None

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        await self.watcher.start()  # raises ConfigError on a bad file at startup
        await self._restore_workloads()
        self._rebuild()
        # Key material: file I/O and key generation, off the event loop.
        ca, tokens = await asyncio.to_thread(self._load_security)
        self.ca, self.tokens = ca, tokens
        self.metrics.root_expiry.set(ca.root.not_valid_after_utc.timestamp())
        reviewer = (
            KubeTokenReviewer(self.watcher.client) if isinstance(self.watcher, KubeSource) else None
        )
        self._call_auth = CallAuthenticator(
            Authenticator(tokens.verifier(), self.options.trust_domain, reviewer)
        )
        server = grpc.aio.server(
            options=[
                *grpc_stream_options(self.options.xds),
                ("grpc.keepalive_time_ms", 30_000),
                ("grpc.keepalive_timeout_ms", 10_000),
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.max_receive_message_length", 64 << 20),
                ("grpc.max_send_message_length", 256 << 20),
            ]
        )
        self.xds.add_to(server)
        self._ca_service = CertificateService(ca, self._call_auth, self.metrics)
        await self._ca_service.start()
        self._ca_service.add_to(server)
        self.xds_port = server.add_insecure_port(self.options.xds_address)
        if self.xds_port == 0:
            raise OSError(f"cannot listen on --xds-address {self.options.xds_address}")
        await self._add_tls_ports(server, ca)
        await server.start()
        self._grpc = server
        await self._start_webhook(ca)
        await self.push_loop.start()
        self._expiry_task = asyncio.create_task(self._expire_workloads(), name="workload-expiry")
        self._save_task = asyncio.create_task(self._save_workloads(), name="workload-save")
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

    @property
    def ca_service(self) -> CertificateService | None:
        """The CA's gRPC service and its signing worker (set by start())."""
        return self._ca_service

    def _load_security(self) -> tuple[CertificateAuthority, TokenIssuer]:
        """The CA and the token key (blocking; called through asyncio.to_thread)."""
        o = self.options
        limits = CaLimits(max_workload_ttl=o.max_workload_cert_ttl)
        if o.ca_cert or o.ca_key or o.ca_chain:
            if not (o.ca_cert and o.ca_key):
                raise CaError("a plugged-in CA needs both --ca-cert and --ca-key")
            ca = authority_from_files(
                o.ca_cert, o.ca_key, o.ca_chain or None, o.trust_domain, limits
            )
            logger.info("CA: plugged in from %s", o.ca_cert)
        elif o.state_dir:
            ca = authority_from_state_dir(o.state_dir, o.trust_domain, limits)
        else:
            ca = in_memory_authority(o.trust_domain, limits)
            logger.info("CA: in memory (no state dir)")
        if o.state_dir:
            try:
                key = load_or_create_token_key(o.state_dir)
            except (OSError, ValueError) as e:
                raise CaError(f"token key: {e}") from None
        else:
            key = ec.generate_private_key(ec.SECP256R1())
        return ca, TokenIssuer(key)

    async def _add_tls_ports(self, server: grpc.aio.Server, ca: CertificateAuthority) -> None:
        o = self.options
        if not (o.secure_xds_address or o.mtls_xds_address):
            return
        hosts = [_host(a) for a in (o.secure_xds_address, o.mtls_xds_address) if a and _host(a)]
        ips = [h for h in hosts if _is_ip(h) and not ipaddress.ip_address(h).is_unspecified]
        names = ["localhost", "pilotfish-control", "istiod.istio-system.svc", o.id]
        names += [h for h in hosts if not _is_ip(h)]
        self.serving = ServingCertificates(
            ca, names, [*ips, "127.0.0.1"], dt.timedelta(seconds=o.serving_cert_ttl)
        )
        await self.serving.start()
        if o.secure_xds_address:
            creds = self.serving.grpc_credentials()
            self.secure_xds_port = server.add_secure_port(o.secure_xds_address, creds)
            if self.secure_xds_port == 0:
                raise OSError(f"cannot listen on --secure-xds-address {o.secure_xds_address}")
        if o.mtls_xds_address:
            creds = self.serving.grpc_credentials(client_root_pem=ca.root_pem.encode())
            self.mtls_xds_port = server.add_secure_port(o.mtls_xds_address, creds)
            if self.mtls_xds_port == 0:
                raise OSError(f"cannot listen on --mtls-xds-address {o.mtls_xds_address}")

    async def _start_webhook(self, ca: CertificateAuthority) -> None:
        o = self.options
        if o.webhook_address:
            template = await asyncio.to_thread(
                load_template, o.injection_template or DEFAULT_TEMPLATE
            )
            host = _host(o.webhook_address)
            ips = [host] if _is_ip(host) and not ipaddress.ip_address(host).is_unspecified else []
            # The API server calls the webhook through the Service: istiod.istio-system.svc.
            names = ["istiod.istio-system.svc", "localhost", o.id]
            names += [host] if host and not _is_ip(host) else []
            self.webhook_serving = ServingCertificates(
                ca, names, [*ips, "127.0.0.1"], dt.timedelta(seconds=o.serving_cert_ttl)
            )
            await self.webhook_serving.start()
            context = await self.webhook_serving.ssl_context()
            labels = (
                self.watcher.namespace_labels
                if isinstance(self.watcher, KubeSource)
                else _no_namespace_labels
            )
            values = InjectionValues(o.injection_image, o.injection_pilot_address)
            self.webhook = WebhookServer(template, labels, values)
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
        if o.webhook_config_name and isinstance(self.watcher, KubeSource):
            self.ca_bundle_patcher = CaBundlePatcher(
                self.watcher.client, ca.root_pem, o.webhook_config_name
            )
            await self.ca_bundle_patcher.start()

    async def _authorize_stream(
        self, context: grpc.aio.ServicerContext, proxy: Proxy
    ) -> tuple[grpc.StatusCode, str] | Identity | None:
        """Streams on the TLS ports: the caller must authenticate and may only claim its own
        identity, which is returned (syncz over xDS shows it what --debug-allow lets it see).
        The plaintext port serves anyone (local use and tests, as DESIGN says)."""
        if not is_secure(context):
            return None
        assert self._call_auth is not None
        try:
            identity = await self._call_auth.identity_async(context)
            check_claim(identity, proxy.namespace, proxy.service_account)
        except AuthError as e:
            self.metrics.xds_auth_failures.labels(e.denial.value).inc()
            return STATUS[e.denial], e.message
        return identity

    async def close(self, grace: float = 1.0) -> None:
        self.ready = False
        await self.debug.close()
        if self.ca_bundle_patcher is not None:
            await self.ca_bundle_patcher.close()
        if self.webhook is not None:
            await self.webhook.close()
        for task in (self._expiry_task, self._save_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.push_loop.close()
        if self._grpc is not None:
            try:
                # Bounded: shutdown must not hang on a stream that will not finish.
                async with asyncio.timeout(grace + 5.0):
                    await self._grpc.stop(grace)
            except TimeoutError:
                logger.warning("gRPC server did not stop within %.1fs", grace + 5.0)
            self._grpc = None
        await self.xds.close()
        for serving in (self.serving, self.webhook_serving):
            if serving is not None:
                await serving.close()
        if self._ca_service is not None:
            await self._ca_service.close()
            self._ca_service = None
        await self.watcher.close()

    async def __aenter__(self) -> ControlPlane:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- ResourceSource (for the xDS server) -----------------------------------------------

    def resources(self, proxy: Proxy, type_urls: Iterable[str]) -> dict[str, ResourceSet]:
        ctx = self._ctx
        before = self.cache.serializations
        out: dict[str, ResourceSet] = {}
        generators = generators_for(proxy)
        for t in type_urls:
            gen = generators.get(t)
            out[t] = gen(ctx, proxy) if gen is not None else EMPTY
        made = self.cache.serializations - before
        if made:
            self.metrics.serializations.inc(made)
        return out

    def push_started_at(self) -> float:
        return self._push_started

    @property
    def index(self) -> MeshIndex:
        return self._ctx.index

    # --- pushes ----------------------------------------------------------------------------

    def _rebuild(self) -> None:
        self._index_version += 1
        # Derived from the previous index when only workloads changed (MeshIndex.next), and
        # then generated incrementally over the previous push (GenContext).
        index = self._ctx.index.next(
            self.watcher.current,
            self.registry.workloads(),
            trust_domain=self.options.trust_domain,
            version=self._index_version,
            outbound_traffic_policy=self.options.outbound_traffic_policy,
        )
        self._ctx = next_context(self._ctx, index)
        self.metrics.services.set(len(index.services))
        self.metrics.config_errors.set(len(self.watcher.errors))

    async def _push(self, reasons: set[str], waited: float) -> None:
        self.metrics.debounce.observe(waited)
        for r in reasons or {"unknown"}:
            self.metrics.push_triggers.labels(r).inc()
        self.push_now(reasons, waited)

    def push_now(self, reasons: Iterable[str] = ("manual",), waited: float = 0.0) -> int:
        """Rebuild the index from the current config and workloads and push to every stream
        (skips the debounce; benchmarks and tests use it). Returns the streams marked.

        When services, Sidecars, security policies and traffic rules are unchanged, only
        workloads moved: the new index is derived from the previous one and names the
        services that select a changed workload. That changes their endpoints and nothing
        else (clusters, listeners and routes are built from those objects alone), so only EDS
        is pushed, as Istio's incremental EDS push does, and only those services' assignments
        are regenerated. The exception is a change of the identities behind a service (the
        SANs its mTLS clusters accept), which Istio answers with a full push too."""
        self._push_started = started = time.monotonic()
        wall = time.time()
        old_index = self._ctx.index
        self._rebuild()
        self.pushes += 1
        eds_only = endpoints_only(old_index, self._ctx.index)
        if eds_only:
            self.metrics.push_triggers.labels("eds_only").inc()
            streams = self.xds.push_all(_EDS_ONLY)
        else:
            streams = self.xds.push_all()
        snapshot = self.watcher.snapshot_at if isinstance(self.watcher, ConfigWatcher) else None
        self.push_log.append(
            PushRecord(
                self.pushes,
                started,
                wall,
                tuple(sorted(reasons)),
                waited,
                eds_only,
                streams,
                snapshot,
            )
        )
        return streams

    async def _on_config(self, config: MeshConfig) -> None:
        del config
        self.push_loop.notify("config")

    def _on_proxy_connect(self, proxy: Proxy) -> None:
        if self.options.kubernetes:
            return  # pods come from the API server
        if self.registry.connect(proxy):
            self.push_loop.notify("registry")
            self._save_wake.set()

    def _on_proxy_disconnect(self, proxy: Proxy) -> None:
        self.registry.disconnect(proxy, time.monotonic())
        self._expiry_wake.set()

    async def _expire_workloads(self) -> None:
        while True:
            deadline = self.registry.next_expiry()
            if deadline is None:
                await self._expiry_wake.wait()
                self._expiry_wake.clear()
                continue
            delay = deadline - time.monotonic()
            if delay > 0:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancellation
                # that arrives with the event (a stream closing as the control plane stops),
                # and close() would then wait out the grace period.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._expiry_wake.wait()
                    self._expiry_wake.clear()
                continue
            removed = self.registry.expire(time.monotonic())
            if removed:
                logger.info("workloads removed after grace: %s", [w.address for w in removed])
                self.push_loop.notify("registry")
                self._save_wake.set()

    # --- registry persistence --------------------------------------------------------------

    @property
    def _registry_file(self) -> Path | None:
        if not self.options.state_dir:
            return None
        return Path(self.options.state_dir) / "workloads.json"

    async def _restore_workloads(self) -> None:
        path = self._registry_file
        if path is None:
            return
        try:
            text = await asyncio.to_thread(path.read_text)
            entries = json.loads(text)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            logger.warning("ignoring %s: %s", path, e)
            return
        if isinstance(entries, list):
            n = self.registry.restore(entries, time.monotonic())
            if n:
                logger.info("restored %d auto-registered workload(s) from %s", n, path)
                self._expiry_wake.set()

    async def _save_workloads(self) -> None:
        path = self._registry_file
        if path is None:
            return
        while True:
            await self._save_wake.wait()
            self._save_wake.clear()
            data = json.dumps(self.registry.snapshot(), indent=1)
            try:
                await asyncio.to_thread(_write_private, path, data)
            except OSError as e:
                logger.warning("cannot save %s: %s", path, e)
            await asyncio.sleep(0.2)  # coalesce bursts of (dis)connections


def _no_namespace_labels(namespace: str) -> None:
    """File mode has no namespaces: only a pod's own label or annotation asks for a sidecar."""
    del namespace


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _host(address: str) -> str:
    return address.rpartition(":")[0].strip("[]")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _shape(config: MeshConfig) -> tuple[object, ...]:
    """The config objects that clusters, listeners and routes are built from. A
    VirtualService or DestinationRule change is a full push: it can add or remove clusters
    (subsets), change cluster settings, routes and TCP listeners. When two snapshots have
    the same shape, the index of the second is derived from the first's (MeshIndex.next)
    and the push may be EDS only (endpoints_only)."""
    return rules_of(config)


def _with_port(address: str, port: int) -> str:
    host, _, _ = address.rpartition(":")
    return f"{host}:{port}"
