"""The agent, wired: upstream channel → xDS proxy (relay + agent stream + handlers) → Envoy,
plus the status server. Each part is its own component with start/close; this module only
connects them and decides readiness and shutdown order."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import grpc

from agent.certstart import WorkloadCerts
from agent.config import AgentConfig
from agent.dns.forwarder import Forwarder, parse_upstream
from agent.dns.handler import NameTableHandler
from agent.dns.responder import Responder
from agent.dns.server import DnsServer
from agent.dns.table import LookupTable, kubernetes_search_domains
from agent.httpio import HttpClientError, fetch
from agent.launch import Launch
from agent.metrics import AgentMetrics
from agent.relaystart import LocalRelay
from agent.sds.certfiles import CertPaths, refresh_interval
from agent.startup import StartupTimeline
from agent.status import StatusServer
from agent.xdsproxy.agentstream import AgentStream
from agent.xdsproxy.handlers import HandlerRegistry
from pilotfish_common.lifecycle import Lifecycle, close_each
from protos.typeurls import NAME_TABLE, PEER_TABLE, WORKLOAD_PROBE

if TYPE_CHECKING:
    from agent.envoy.process import EnvoySupervisor
    from agent.health.appprobe import AppProbes
    from agent.health.checker import HealthChecker
    from agent.telemetry.als import AccessLogServer
    from agent.telemetry.records import RecordFeed

logger = logging.getLogger(__name__)

_UPDATE_STATS = "/stats?filter=" + quote(
    "^((cluster_manager.cds|listener_manager.lds).update_success|server.state"
    "|listener_manager.workers_started)$",
    safe="",
)


# Istio's template for the listener a gRPC xDS server asks for (`%s`: its IP:port).
SERVER_LISTENER_TEMPLATE = "xds.istio.io/grpc/lds/inbound/%s"


def grpc_bootstrap(cfg: AgentConfig) -> dict[str, Any]:
    """The bootstrap for proxyless gRPC clients and servers: xDS through the agent's socket,
    the workload certificate files as certificate provider `default` (what the control plane
    names in TLS contexts, as Istio's does), and the listener name servers ask for."""
    meta = cfg.node_metadata()
    meta["GENERATOR"] = "grpc"
    paths = CertPaths(cfg.grpc_cert_dir.resolve())
    return {
        "xds_servers": [
            {
                "server_uri": f"unix://{cfg.xds_socket.resolve()}",
                "channel_creds": [{"type": "insecure"}],
                "server_features": ["xds_v3"],
            }
        ],
        "node": {"id": cfg.node_id, "metadata": meta, "locality": {}},
        "certificate_providers": {
            "default": {
                "plugin_name": "file_watcher",
                "config": {
                    "certificate_file": str(paths.chain),
                    "private_key_file": str(paths.key),
                    "ca_certificate_file": str(paths.root),
                    "refresh_interval": f"{refresh_interval(cfg.workload_cert_ttl)}s",
                },
            }
        },
        "server_listener_resource_name_template": SERVER_LISTENER_TEMPLATE,
    }


def mode_modules(cfg: AgentConfig) -> list[str]:
    """What `Agent(cfg)` imports only for its mode (below): the standard metrics' modules
    with Envoy, the health checker for a WorkloadGroup member, the app probes' for a pod that
    has some. `agent/__main__.py` imports them in its thread with this module, not on the
    event loop when the agent is made."""
    modules = []
    if cfg.standard_metrics and not cfg.proxy_only:
        modules += [
            "agent.telemetry.fifo",  # for a `Launch` made by `Agent` (agent/launch.py)
            "agent.telemetry.aggregator",
            "agent.telemetry.als",
            "agent.telemetry.peers",
            "agent.telemetry.records",
        ]
    if cfg.workload_group:
        modules.append("agent.health.checker")
    if cfg.app_probers:
        modules.append("agent.health.appprobe")
    return modules


class Agent(Lifecycle):
    def __init__(
        self,
        cfg: AgentConfig,
        handlers: HandlerRegistry | None = None,
        log_level: str = "info",
        timeline: StartupTimeline | None = None,
        launch: Launch | None = None,
    ) -> None:
        """`launch`: the parts started before the heavy imports (agent/launch.py), when
        `agent/__main__.py` made them; otherwise made here and started by `start()`."""
        self.cfg = cfg
        self.timeline = timeline or (launch.timeline if launch else StartupTimeline())
        self.launch = launch or Launch(cfg, log_level=log_level, timeline=self.timeline)
        self.upstream = self.launch.upstream
        self.metrics = self.launch.metrics or AgentMetrics()
        # The relay and the certificate's parts: made (and started) by the launch when
        # `agent/__main__.py` asked for them, before the heavy imports; `handlers` is for
        # an agent that makes them itself.
        self.relay = self.launch.relay or LocalRelay(
            cfg,
            self.upstream,
            self.metrics,
            self.timeline,
            handlers=handlers,
            server=self.launch.xds_server,
        )
        self.handlers = self.relay.handlers
        self.stats = self.relay.stats
        self.names: NameTableHandler | None = None
        self.dns: DnsServer | None = None
        # REDIRECT: the capture rules send the app's DNS queries to 127.0.0.1:<dns port> (what
        # an OUTPUT-chain REDIRECT rewrites to), so the server listens there too. A server of
        # its own rather than a wildcard bind: its replies must come from 127.0.0.1 for
        # conntrack to map them back to the resolver address the app asked.
        self.dns_local: DnsServer | None = None
        # The same on ::1, where ip6tables' REDIRECT delivers queries to IPv6 resolvers in a
        # dual-stack pod; only when the pod's loopback has ::1 (IPv6 enabled).
        self.dns_local6: DnsServer | None = None
        # In REDIRECT as root, Envoy runs as the proxy user the capture rules exclude.
        self.run_as = self.launch.run_as
        # DNS proxying is for sidecars (Istio's too): a router resolves nothing for an app,
        # and the control plane sends routers no name table to wait for.
        if cfg.dns_port and not cfg.is_router:
            self._setup_dns(cfg)
        self.certs = self.launch.certs or WorkloadCerts(
            cfg,
            self.upstream,
            self.metrics,
            owner=self.run_as[0] if self.run_as else None,
            server=self.launch.sds_server,
        )
        self.secrets = self.certs.secrets
        self.sds = self.certs.sds
        self.cert_files = self.certs.cert_files
        self.downstream = self.relay.downstream
        self.agent_stream = AgentStream(
            self.upstream,
            self.handlers,
            self.stats,
            node_id=cfg.node_id,
            metadata={**cfg.node_metadata(), "AGENT_STREAM": "true"},
        )
        # A WorkloadGroup member runs the group's probe (sent on the agent stream) and reports
        # its health on that stream (agent/health/checker.py).
        self.health: HealthChecker | None = None
        if cfg.workload_group:
            # Imported only for a WorkloadGroup member, as the standard metrics' modules
            # below only with Envoy: an agent loads what its mode uses (issue 23).
            from agent.health.checker import HealthChecker

            stream = self.agent_stream
            self.health = HealthChecker(
                cfg.ip, lambda h: stream.report_health(None if h.healthy else h.reason)
            )
            self.handlers.register(WORKLOAD_PROBE, self.health)
        # Istio's standard metrics, from Envoy's generated loggers (HTTP records on the
        # metrics FIFO, TCP entries on the access log stream); served with the agent's own
        # metrics.
        self.als: AccessLogServer | None = None
        self.records: RecordFeed | None = None
        if self.launch.als_server is not None:
            from agent.telemetry.aggregator import MetricsAggregator
            from agent.telemetry.als import AccessLogServer
            from agent.telemetry.peers import PeerDirectory
            from agent.telemetry.records import RecordFeed

            # The mesh's workloads by address, from the control plane: who a TCP caller is.
            peers = PeerDirectory()
            self.handlers.register(PEER_TABLE, peers)
            aggregator = MetricsAggregator(peers=peers)
            self.metrics.registry.register(aggregator)
            owner = self.run_as[0] if self.run_as else None
            self.als = AccessLogServer(
                cfg.als_socket, aggregator, owner=owner, server=self.launch.als_server
            )
            self.records = RecordFeed(aggregator)
        self.envoy: EnvoySupervisor | None = self.launch.envoy
        admin = self._admin = self.launch.admin_url
        # The app's own probes, rewritten by the injector to come through here; their
        # modules only for a pod that has some (as the parser's, agent/config.py).
        self.app_probes: AppProbes | None = None
        if cfg.app_probers:
            from agent.health.appprobe import AppProbes, probe_destination

            self.app_probes = AppProbes(
                cfg.app_probers,
                probe_destination(cfg.ip, cfg.app_probe_localhost),
                cfg.status_port,
            )
        self.status = StatusServer(
            cfg.ip,
            cfg.status_port,
            readiness=self.readiness,
            metrics=self.metrics,
            envoy_stats_url=None if cfg.proxy_only else admin + "/stats/prometheus",
            on_quit=self.request_stop,
            on_drain=self._start_drain,
            ndsz=self.names.ndsz if self.names else lambda: {"dns": "disabled"},
            app_probe=self.app_probes.answer if self.app_probes else None,
            app_probe_paths=cfg.app_probers,
            handlers=self.handlers.describe,
        )
        self.stop_requested = asyncio.Event()
        self._started_at = time.monotonic()
        self._timeline_tasks: list[asyncio.Task[None]] = []

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Envoy is started as early as it can be, by `Launch` (agent/launch.py): its
        sockets are bound (Envoy's first connections wait in the kernel's queue until they
        are served here) and its ~50 ms start runs on another core while the agent imports
        and starts the rest. The certificate comes first: Envoy's listeners wait for it."""
        tl = self.timeline
        await self.launch.start()
        # Key, CSR and the signing call go on in the background from here (already, when
        # the launch started them).
        await self.certs.start()
        self._timeline_tasks.append(
            asyncio.create_task(self._mark_when(self.secrets.wait_ready(), "csr signed"))
        )
        await self.relay.serve()
        # The agent stream next: readiness waits for its name table, whose round trip then
        # overlaps the rest of the start.
        if self.health is not None:
            await self.health.start()
        await self.agent_stream.start()
        if self.names is not None:
            self._timeline_tasks.append(
                asyncio.create_task(self._mark_when(self.names.received.wait(), "name table"))
            )
        if self.als is not None:
            await self.als.start()
        if self.records is not None and self.launch.metrics_fifo is not None:
            self.launch.metrics_fifo.start(self.records)
        tl.mark("serving")
        if self.envoy is None:
            path = self.cfg.workdir / "grpc-bootstrap.json"
            text = json.dumps(grpc_bootstrap(self.cfg), indent=2)
            await asyncio.to_thread(_write_atomic, path, text)
            logger.info("proxy-only: gRPC bootstrap at %s", path)
        if self.dns is not None:
            await self.dns.start()
        if self.dns_local is not None:
            await self.dns_local.start()
        if self.dns_local6 is not None:
            try:
                await self.dns_local6.start()
            except OSError as e:  # IPv6 disabled here: nothing is redirected to ::1 either
                logger.debug("no DNS server on ::1: %s", e)
                self.dns_local6 = None
        await self.status.start()
        tl.mark("status server")
        logger.info(
            "agent %s up: control plane %s, xDS socket %s, status %s:%d",
            self.cfg.node_id,
            self.upstream.target,
            self.cfg.xds_socket,
            self.cfg.ip,
            self.cfg.status_port,
        )

    async def _mark_when(self, event: Awaitable[object], name: str) -> None:
        await event
        self.timeline.mark(name)

    async def run(self) -> int:
        """Until asked to stop (exit 0) or until Envoy dies on its own (exit 1)."""
        waits = [asyncio.create_task(self.stop_requested.wait())]
        if self.envoy is not None:
            waits.append(asyncio.create_task(self.envoy.exited.wait()))
        _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for t in pending:
            t.cancel()
        if self.envoy is not None and self.envoy.exited.is_set() and not self.envoy.stopping:
            logger.error("envoy exited unexpectedly with code %s", self.envoy.returncode)
            return 1
        return 0

    async def close(self) -> None:
        """Drain Envoy's listeners, stop Envoy, then the rest (reverse start order)."""
        if self.envoy is not None:
            if not self.envoy.exited.is_set():
                await self.envoy.drain()
            await self.envoy.close()
        await self.status.close()
        for task in self._timeline_tasks:
            task.cancel()
        await asyncio.gather(*self._timeline_tasks, return_exceptions=True)
        await close_each(
            self.dns_local6,
            self.dns_local,
            self.dns,
            self.health,
            self.agent_stream,
            self.als,
            self.downstream,
            self.sds,
            self.cert_files,
            self.secrets,
            self.handlers,
            self.launch,  # the upstream channel (the rest is closed above)
        )

    def _setup_dns(self, cfg: AgentConfig) -> None:
        """The DNS server and the NameTable handler that feeds it (through the registry,
        like any other handler: NDS reaches the server only through the agent stream)."""
        responder = Responder()

        def swap(table: LookupTable) -> None:
            responder.table = table

        self.names = NameTableHandler(
            swap,
            namespace=cfg.namespace,
            cluster_domain=cfg.cluster_domain,
            search_domains=kubernetes_search_domains(cfg.namespace, cfg.cluster_domain),
        )
        self.handlers.register(NAME_TABLE, self.names)
        forwarder = Forwarder(parse_upstream(u) for u in cfg.dns_upstream)
        self.dns = DnsServer(cfg.ip, cfg.dns_port, responder, forwarder)
        if cfg.redirect and cfg.ip != "127.0.0.1":
            self.dns_local = DnsServer("127.0.0.1", cfg.dns_port, responder, forwarder)
        if cfg.redirect and cfg.ip != "::1":
            self.dns_local6 = DnsServer("::1", cfg.dns_port, responder, forwarder)

    def request_stop(self) -> None:
        self.stop_requested.set()

    async def _start_drain(self) -> None:
        if self.envoy is not None:
            await self.envoy.start_drain()

    # --- readiness -------------------------------------------------------------------------

    async def readiness(self) -> str | None:
        """None when ready; otherwise why not. The first time it is ready, the start timeline
        is logged."""
        reason = await self._why_not_ready()
        if reason is None and "ready" not in self.timeline.marks:
            self.timeline.mark("ready")
            logger.info("%s", self.timeline.summary())
        return reason

    async def _why_not_ready(self) -> str | None:
        """DESIGN: the agent holds a workload certificate
        and, with Envoy, Envoy has accepted LDS and CDS; in proxy-only mode the upstream
        channel is up and the certificate files hold the current certificate. With DNS on, a
        name table must have arrived too."""
        if self.upstream.state() is not grpc.ChannelConnectivity.READY:
            return await self.upstream.problem()
        if not self.secrets.ready:
            why = self.secrets.last_error or "waiting for the CA"
            return f"no workload certificate yet: {why}"
        if self.names is not None and not self.names.received.is_set():
            return "no DNS name table from the control plane yet"
        if self.cert_files is not None and not self.cert_files.current:
            why = self.cert_files.last_error or "being written"
            return f"gRPC certificate files in {self.cert_files.paths.directory}: {why}"
        if self.envoy is None:
            return None
        if not self.envoy.running:
            return "envoy is not running"
        try:
            status, body = await fetch(self._admin + _UPDATE_STATS, timeout=2.0)
        except (HttpClientError, TimeoutError, OSError) as e:
            return f"envoy admin not reachable: {e}"
        if status != 200:
            return f"envoy admin answered HTTP {status}"
        text = body.decode(errors="replace")
        values = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
        missing = [
            kind
            for kind, stat in (
                ("CDS", "cluster_manager.cds.update_success"),
                ("LDS", "listener_manager.lds.update_success"),
            )
            if int(values.get(stat, "0") or 0) < 1
        ]
        if missing:
            reason = "envoy has not accepted " + " and ".join(missing) + " yet"
            if self.upstream.state() is not grpc.ChannelConnectivity.READY:
                reason += f" ({await self.upstream.problem()})"
            return reason
        # LDS/CDS accepted is not yet serving: Envoy's listeners (15021 among them) accept
        # connections only once its initialization is over (server.state 0 = LIVE).
        if values.get("server.state", "").strip() != "0":
            return "envoy is still initializing (server.state is not LIVE)"
        # LIVE can come before the listeners accept: workers start (and listen) only once
        # every first listener has warmed, e.g. has the certificates its chains name.
        if values.get("listener_manager.workers_started", "").strip() != "1":
            return "envoy's listeners are still warming (listener_manager.workers_started is 0)"
        return None


def _write_atomic(path: os.PathLike[str], text: str) -> None:
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
