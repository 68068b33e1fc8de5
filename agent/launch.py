"""The first part of the agent's start, done before its heavy imports (agent/app.py and all it
pulls in: cryptography, the protos, DNS, telemetry, metrics).

Envoy is started here, so that its own start (~50 ms of CPU) runs on the other core while
this process imports the rest. Its sockets (XDS, SDS, ALS) are bound first but served only
later (agent/unixsocket.py): Envoy's first connections wait in the kernel's queue until the
servers behind them start, instead of failing into Envoy's reconnect backoff. The metrics
FIFO is opened first too: Envoy's open of it for writing would block until it has a reader.
The upstream channel starts connecting here too (TCP and TLS run in gRPC's own threads), so
the first CSR and the first xDS request find it up.

Only light modules are imported here: grpc (which every part of the agent needs) and the
agent's own small ones. tests/unit/test_agent_launch.py keeps it so.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING

from agent.config import AgentConfig
from agent.startup import StartupTimeline
from agent.telemetry.fifo import MetricsFifo
from agent.unixsocket import (
    UnixGrpcServer,
    als_socket_server,
    make_workdir,
    sds_socket_server,
    xds_socket_server,
)
from agent.xdsproxy.upstream import UpstreamChannel, UpstreamTls
from pilotfish_common.lifecycle import Lifecycle

if TYPE_CHECKING:
    from agent.envoy.process import EnvoySupervisor

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


def admin_url(cfg: AgentConfig) -> str:
    host = f"[{cfg.ip}]" if ":" in cfg.ip else cfg.ip
    return f"http://{host}:{cfg.envoy_admin_port}"


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
    ) -> None:
        self.cfg = cfg
        self.timeline = timeline or StartupTimeline()
        # In REDIRECT as root, Envoy runs as the proxy user the capture rules exclude.
        self.run_as: tuple[int, int] | None = None
        if cfg.redirect and not cfg.proxy_only and os.geteuid() == 0:
            self.run_as = (cfg.proxy_uid, cfg.proxy_gid)
        owner = self.run_as[0] if self.run_as else None
        self.xds_server = xds_socket_server(cfg.xds_socket)
        self.sds_server = sds_socket_server(cfg.sds_socket, owner)
        # Istio's standard metrics come from Envoy's access log stream.
        self.als_server: UnixGrpcServer | None = None
        self.metrics_fifo: MetricsFifo | None = None
        if cfg.standard_metrics and not cfg.proxy_only:
            self.als_server = als_socket_server(cfg.als_socket, owner)
            self.metrics_fifo = MetricsFifo(cfg.metrics_fifo, owner)
        self.upstream = upstream_channel(cfg)
        self.admin_url = admin_url(cfg)
        self.envoy: EnvoySupervisor | None = None
        if not cfg.proxy_only:
            # Only with Envoy (a proxy-only agent never loads them).
            from agent.envoy.drain import DrainPlan
            from agent.envoy.process import EnvoySupervisor

            self.envoy = EnvoySupervisor(
                cfg.envoy_binary,
                cfg.workdir / "envoy-rev.json",
                admin_url=self.admin_url,
                drain_duration=cfg.drain_duration,
                drain_plan=DrainPlan(
                    duration=cfg.drain_duration,
                    exit_on_zero_active_connections=cfg.exit_on_zero_active_connections,
                    minimum=cfg.minimum_drain_duration,
                ),
                log_level="warning" if log_level != "debug" else "info",
                run_as=self.run_as,
            )
        self._started = False
        self._channel_up: asyncio.Task[None] | None = None

    @property
    def servers(self) -> list[UnixGrpcServer]:
        return [s for s in (self.xds_server, self.sds_server, self.als_server) if s is not None]

    async def start(self) -> None:
        """Sockets, upstream channel, Envoy, in that order (idempotent)."""
        if self._started:
            return
        self._started = True
        cfg = self.cfg
        await asyncio.to_thread(make_workdir, cfg.workdir)
        for server in self.servers:
            server.bind()
        if self.metrics_fifo is not None:
            self.metrics_fifo.open()
        if self.run_as is not None:
            # The socket is 0660: Envoy reaches it through the proxy group.
            await asyncio.to_thread(os.chown, cfg.xds_socket, -1, self.run_as[1])
        # The channel first: a root certificate that cannot be used fails the start before
        # Envoy exists (reading and checking it takes a millisecond).
        await self.upstream.start()
        self._channel_up = asyncio.create_task(self._mark_channel_up(), name="channel-up")
        if self.envoy is not None:
            from agent.envoy.bootstrap import from_agent_config, write_bootstrap

            opts = from_agent_config(cfg)
            await asyncio.to_thread(write_bootstrap, cfg.workdir / "envoy-rev.json", opts)
            await self.envoy.start()
            self.timeline.mark("envoy spawned")

    async def _mark_channel_up(self) -> None:
        await self.upstream.channel.channel_ready()
        self.timeline.mark("channel up")

    async def close(self) -> None:
        if self.envoy is not None:
            await self.envoy.close()
        if self._channel_up is not None:
            self._channel_up.cancel()
            await asyncio.gather(self._channel_up, return_exceptions=True)
            self._channel_up = None
        for server in self.servers:
            await server.close(0.5)
        if self.metrics_fifo is not None:
            await self.metrics_fifo.close()
        await self.upstream.close()
