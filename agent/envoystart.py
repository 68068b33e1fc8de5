"""Envoy's supervisor for an agent's config (agent/envoy/process.py), made before anything
heavy is imported.

`agent/__main__.py` starts Envoy itself as soon as its config is parsed (`start_envoy_now`,
agent/envoy/earlystart.py), before the event loop exists. Where that cannot be done, it
spawns Envoy's launcher first (`EnvoySupervisor.spawn`): the launcher's own interpreter then
starts on the other core while the agent imports gRPC and binds Envoy's sockets, and Envoy
is exec'd the moment `Launch.start` says so (agent/launch.py). So this
module and Envoy's own import no gRPC (tests/unit/test_agent_launch.py keeps it so).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from agent.config import AgentConfig

if TYPE_CHECKING:
    from agent.envoy.process import EnvoySupervisor

logger = logging.getLogger(__name__)


def envoy_run_as(cfg: AgentConfig) -> tuple[int, int] | None:
    """In REDIRECT as root, Envoy runs as the proxy user the capture rules exclude."""
    if cfg.redirect and not cfg.proxy_only and os.geteuid() == 0:
        return (cfg.proxy_uid, cfg.proxy_gid)
    return None


def admin_url(cfg: AgentConfig) -> str:
    host = f"[{cfg.ip}]" if ":" in cfg.ip else cfg.ip
    return f"http://{host}:{cfg.envoy_admin_port}"


def envoy_supervisor(cfg: AgentConfig, log_level: str = "info") -> EnvoySupervisor:
    """The Envoy an agent with `cfg` runs (not started)."""
    # Only with Envoy: a proxy-only agent never loads Envoy's modules.
    from agent.envoy.drain import DrainPlan
    from agent.envoy.process import EnvoySupervisor

    return EnvoySupervisor(
        cfg.envoy_binary,
        cfg.workdir / "envoy-rev.json",
        admin_url=admin_url(cfg),
        drain_duration=cfg.drain_duration,
        drain_plan=DrainPlan(
            duration=cfg.drain_duration,
            exit_on_zero_active_connections=cfg.exit_on_zero_active_connections,
            minimum=cfg.minimum_drain_duration,
        ),
        log_level="warning" if log_level != "debug" else "info",
        run_as=envoy_run_as(cfg),
    )


def start_envoy_now(cfg: AgentConfig, envoy: EnvoySupervisor) -> bool:
    """Start `envoy` at once from a fork of this process (agent/envoy/earlystart.py), before
    the event loop, threads and gRPC exist: the workdir made, the bootstrap written, Envoy
    exec'd, and `envoy` adopting it. False, with nothing started, where that cannot be done
    (a thread already runs, the fork failed, no Envoy binary): the agent then spawns Envoy's
    launcher as before, which says what is wrong. Blocking: a few milliseconds."""
    from agent.envoy.bootstrap import from_agent_config, write_bootstrap
    from agent.envoy.earlystart import fork_exec, fork_is_safe
    from agent.envoy.process import EnvoyError, executable
    from agent.workdir import make_workdir

    if not fork_is_safe():  # asked first: the launcher's path makes the workdir and bootstrap
        return False
    try:
        command = envoy.command()
    except EnvoyError:
        return False
    if not executable(command[0]):
        return False
    try:
        make_workdir(cfg.workdir)
        write_bootstrap(envoy.bootstrap_path, from_agent_config(cfg))
    except OSError as e:
        logger.debug("Envoy not started early: %s", e)
        return False
    forked = fork_exec(command, envoy.run_as)
    if forked is None:
        return False
    envoy.adopt(forked)
    return True
