"""The first part of the agent's start, done before its heavy imports (agent/app.py and all it
pulls in: the protos, SDS, DNS, telemetry, metrics).

Envoy is started before this (agent/envoy/earlystart.py: `python -m agent` forks and execs it
before it has an event loop), or, where that could not be done, here (its launcher, spawned
before gRPC was imported, agent/envoystart.py, is told to exec it), so that its own start
(~50 ms of CPU) runs on the other core while this process imports the rest. Its sockets (XDS,
SDS, ALS) are bound here but served only later (agent/unixsocket.py): Envoy's first
connections wait in the kernel's queue until the servers behind them start. A connection
Envoy tries before its socket is bound fails, and Envoy tries again within 20 ms (the
bootstrap's retry policy), not after its default 0.5 s backoff. The metrics FIFO is opened
here too: Envoy's open of it for writing (once it has listeners) would block until it has a
reader. The upstream channel starts connecting here too (TCP and TLS run in gRPC's own
threads), so the first CSR and the first xDS request find it up.

Then, still before the rest is imported, the parts Envoy asks for first are started, in the
order it asks: the xDS relay (`start_relay`, agent/relaystart.py), then the workload
certificate and SDS (`start_certs`, agent/certstart.py); their modules are imported in a
thread, so the event loop keeps relaying meanwhile.

Only light modules are imported by this module itself: grpc (which every part of the agent
needs) and the agent's own small ones. tests/unit/test_agent_launch.py keeps it so.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
from typing import TYPE_CHECKING

from agent.config import AgentConfig
from agent.envoystart import admin_url, envoy_run_as, envoy_supervisor
from agent.startup import StartupTimeline
from agent.unixsocket import (
    UnixGrpcServer,
    als_socket_server,
    sds_socket_server,
    xds_socket_server,
)
from agent.workdir import make_workdir
from agent.xdsproxy.upstream import UpstreamChannel, UpstreamTls
from pilotfish_common.lifecycle import Lifecycle

if TYPE_CHECKING:
    from agent.certstart import WorkloadCerts
    from agent.envoy.process import EnvoySupervisor
    from agent.metrics import AgentMetrics
    from agent.relaystart import LocalRelay
    from agent.sds.keywork import KeyWork
    from agent.sds.workloadcert import WorkloadCert
    from agent.telemetry.fifo import MetricsFifo

logger = logging.getLogger(__name__)


def upstream_channel(cfg: AgentConfig) -> UpstreamChannel:
    """The one channel to the control plane, over TLS when the config says so."""
    tls = None
    if cfg.uses_tls and cfg.ca_root_cert is not None:
        tls = UpstreamTls(cfg.ca_root_cert, cfg.token_file)
    else:
        # Said once up front: otherwise the first sign of it is a refused certificate.
        logger.warning(
            "control plane %s over plaintext: it signs no certificate and registers no "
            "workload there; use its TLS port (15012) with a token and --ca-root-cert",
            ",".join(cfg.control_plane),
        )
    return UpstreamChannel(
        list(cfg.control_plane),
        tls=tls,
        keepalive_time=cfg.keepalive_time,
        keepalive_timeout=cfg.keepalive_timeout,
    )


def _import(module: str) -> None:
    """Import `module` (blocking: run in a thread)."""
    importlib.import_module(module)


class Launch(Lifecycle):
    """The parts of an agent that exist before its heavy imports: the upstream channel, the
    three local sockets (bound, not yet served) and the Envoy process. `Agent` takes them
    over; `close()` is for a start that fails before there is an `Agent`, and idempotent."""

    def __init__(
        self,
        cfg: AgentConfig,
        *,
        log_level: str = "info",
        timeline: StartupTimeline | None = None,
        envoy: EnvoySupervisor | None = None,
        keys: KeyWork | None = None,
    ) -> None:
        """`envoy`: its supervisor, when `agent/__main__.py` made it (and spawned its
        launcher) before importing gRPC; otherwise made here (with Envoy). `keys`: where the
        workload keys are made, the key worker when `agent/__main__.py` forked one
        (agent/sds/keyworker.py); default: in a thread here."""
        self.cfg = cfg
        self.timeline = timeline or StartupTimeline()
        # In REDIRECT as root, Envoy runs as the proxy user the capture rules exclude.
        self.run_as = envoy_run_as(cfg)
        owner = self.run_as[0] if self.run_as else None
        self.xds_server = xds_socket_server(cfg.xds_socket)
        self.sds_server = sds_socket_server(cfg.sds_socket, owner)
        # Istio's standard metrics come from Envoy's access log stream.
        self.als_server: UnixGrpcServer | None = None
        self.metrics_fifo: MetricsFifo | None = None
        if cfg.standard_metrics and not cfg.proxy_only:
            from agent.telemetry.fifo import MetricsFifo

            self.als_server = als_socket_server(cfg.als_socket, owner)
            self.metrics_fifo = MetricsFifo(cfg.metrics_fifo, owner)
        self.upstream = upstream_channel(cfg)
        self.admin_url = admin_url(cfg)
        self.envoy = envoy
        self.keys = keys
        if envoy is None and not cfg.proxy_only:
            self.envoy = envoy_supervisor(cfg, log_level)
        # Made by start_relay() and start_certs(), when asked for; `Agent` takes them.
        self.metrics: AgentMetrics | None = None
        self.relay: LocalRelay | None = None
        self.certs: WorkloadCerts | None = None
        self._started = False
        self._channel_up: asyncio.Task[None] | None = None
        self._cert_signed: asyncio.Task[None] | None = None
        self._first_signing: asyncio.Task[WorkloadCert] | None = None

    @property
    def servers(self) -> list[UnixGrpcServer]:
        return [s for s in (self.xds_server, self.sds_server, self.als_server) if s is not None]

    async def start(self) -> None:
        """Sockets, upstream channel, Envoy, in that order (idempotent)."""
        if self._started:
            return
        self._started = True
        cfg = self.cfg
        # An Envoy started before the event loop (agent/envoystart.py) has its workdir and
        # bootstrap already.
        early = self.envoy is not None and self.envoy.adopted
        if not early:
            await asyncio.to_thread(make_workdir, cfg.workdir)
        for server in self.servers:
            server.bind()
        if self.metrics_fifo is not None:
            self.metrics_fifo.open()
        if self.run_as is not None:
            # The socket is 0660: Envoy reaches it through the proxy group.
            await asyncio.to_thread(os.chown, cfg.xds_socket, -1, self.run_as[1])
        # The channel first: a root certificate that cannot be used fails the start before
        # Envoy is told to start, where it was not started already (reading and checking it
        # takes a millisecond).
        await self.upstream.start()
        self._channel_up = asyncio.create_task(self._mark_channel_up(), name="channel-up")
        if self.envoy is not None and not early:
            from agent.envoy.bootstrap import from_agent_config, write_bootstrap

            opts = from_agent_config(cfg)
            await asyncio.to_thread(write_bootstrap, cfg.workdir / "envoy-rev.json", opts)
            await self.envoy.start()
            self.timeline.mark("envoy spawned")

    async def _mark_channel_up(self) -> None:
        await self.upstream.channel.channel_ready()
        self.timeline.mark("channel up")

    async def start_relay(self) -> None:
        """Serve xDS on the XDS socket (agent/relaystart.py): Envoy's first request, waiting
        in the socket's queue, goes upstream from here (idempotent; after `start()`). Its
        modules (the xDS protos, the relay) are imported in a thread, as are the next
        parts', so that the event loop relays meanwhile."""
        if self.relay is not None:
            return
        await asyncio.to_thread(_import, "agent.relaystart")
        from agent.relaystart import LocalRelay

        self.relay = LocalRelay(
            self.cfg, self.upstream, self._metrics(), self.timeline, server=self.xds_server
        )
        await self.relay.serve()

    async def start_signing(self) -> None:
        """The first workload certificate's key, CSR, signing call and the check of the CA's
        answer, started (idempotent; after `start()`, whose channel it uses): it needs only
        the key work and the CA's protos (agent/sds/firstsign.py), so its round trip and the
        check (in the key worker) run while the secret manager, SDS and the rest are
        imported; `start_certs()` hands it to the secret manager."""
        if self._first_signing is not None:
            return
        await asyncio.to_thread(_import, "agent.sds.firstsign")
        from agent.sds.caclient import CaClient
        from agent.sds.firstsign import sign_new_key
        from agent.sds.keyspec import KeyType, spiffe_id
        from agent.sds.keywork import ThreadKeyWork

        cfg = self.cfg
        identity = spiffe_id(cfg.trust_domain, cfg.namespace, cfg.service_account)
        if self.keys is None:
            self.keys = ThreadKeyWork()
        self._first_signing = asyncio.create_task(
            sign_new_key(
                CaClient(self.upstream, cfg.token_file),
                self.keys,
                identity,
                KeyType(cfg.key_type),
                cfg.workload_cert_ttl,
            ),
            name="first-signing",
        )

    async def start_certs(self) -> None:
        """The workload certificate's parts (agent/certstart.py), started: the key, the CSR
        and the signing call go on in the background from here, and Envoy's SDS requests
        are served (idempotent; after `start()`, whose channel they use)."""
        if self.certs is not None:
            return
        await asyncio.to_thread(_import, "agent.certstart")
        from agent.certstart import WorkloadCerts

        owner = self.run_as[0] if self.run_as else None
        self.certs = WorkloadCerts(
            self.cfg,
            self.upstream,
            self._metrics(),
            owner=owner,
            server=self.sds_server,
            first=self._first_signing,
            keys=self.keys,
        )
        await self.certs.start()
        self._cert_signed = asyncio.create_task(self._mark_cert_signed(), name="cert-signed")

    def _metrics(self) -> AgentMetrics:
        if self.metrics is None:
            from agent.metrics import AgentMetrics

            self.metrics = AgentMetrics()
        return self.metrics

    async def _mark_cert_signed(self) -> None:
        assert self.certs is not None
        await self.certs.secrets.wait_ready()
        self.timeline.mark("csr signed")

    async def close(self) -> None:
        if self.envoy is not None:
            await self.envoy.close()
        # The first signing too: the secret manager, when it took it, awaits it no longer.
        for task in (self._channel_up, self._cert_signed, self._first_signing):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._channel_up = self._cert_signed = self._first_signing = None
        if self.certs is not None:
            await self.certs.close()  # idempotent: `Agent` closes them first when it took them
        if self.keys is not None:
            await self.keys.close()  # idempotent: the secret manager closes it when it has it
        for server in self.servers:
            await server.close(0.5)
        if self.metrics_fifo is not None:
            await self.metrics_fifo.close()
        await self.upstream.close()
