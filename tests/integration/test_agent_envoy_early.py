"""Envoy started before the agent's event loop (agent/envoy/earlystart.py) and adopted by its
supervisor (agent/envoy/process.py): a real Envoy, watched, drained and stopped like a spawned
one; the fork's child set up as the launcher sets it up; and no fork where it is unsafe."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

from agent.config import AgentConfig
from agent.envoy.bootstrap import from_agent_config, write_bootstrap
from agent.envoy.earlystart import EXEC_FAILED
from agent.envoy.process import EnvoySupervisor
from agent.httpio import HttpClientError, fetch
from tests.integration.test_agent_envoy_process import APP_PORT, get, static_bootstrap, supervisor
from tests.support.controlplane import eventually
from tests.support.envoy import (
    envoy_binary,
    envoy_owner,
    owner_killed_takes_envoy,
    wait_admin,
)
from tests.support.net import pod_ip

ROOT = Path(__file__).resolve().parents[2]


def _script(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -c script *args` in a fresh interpreter (one thread, no gRPC: where
    `fork_exec` forks), from the project's root."""
    return subprocess.run(
        [sys.executable, "-c", script, *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


async def test_an_adopted_envoy_is_watched_drained_and_stopped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ip = pod_ip()
    caplog.set_level(logging.INFO, logger="agent.envoy")
    envoy = supervisor(tmp_path, ip, adopt=True)
    assert envoy.adopted and envoy.pid is not None and not envoy.running
    pid = envoy.pid
    async with envoy:  # start(): adopted, so watched, not started again
        assert envoy.pid == pid and envoy.running
        await wait_admin(envoy)
        assert await get(f"http://{ip}:{APP_PORT}/") == (200, "hi")
        # Its stderr is read as a spawned Envoy's is: line by line, at Envoy's level.
        passed = [r for r in caplog.records if r.name == "agent.envoy.log"]
        assert any("starting main dispatch loop" in r.getMessage() for r in passed), passed
        await envoy.start()  # idempotent
        assert envoy.pid == pid
        await envoy.drain()
        assert not envoy.exited.is_set()
        assert await envoy.close() == 0
    assert envoy.exited.is_set() and envoy.returncode == 0
    assert await envoy.wait() == 0
    # Reaped: no zombie left behind.
    assert not Path(f"/proc/{pid}").exists()


async def test_an_adopted_envoy_never_watched_is_still_stopped(tmp_path: Path) -> None:
    """A start that fails before the event loop watched Envoy still stops it on close."""
    envoy = supervisor(tmp_path, pod_ip(), adopt=True, log_level="warning")
    pid = envoy.pid
    assert pid is not None
    code = await envoy.close()
    assert code in (0, -signal.SIGTERM)  # stopped early in its start, or gracefully
    assert not Path(f"/proc/{pid}").exists()


_OWNER = """
import asyncio, json, sys
from pathlib import Path
import uvloop
from agent.envoy.earlystart import fork_exec
from agent.envoy.process import EnvoySupervisor
from agent.httpio import HttpClientError, fetch

envoy = EnvoySupervisor(sys.argv[3], Path(sys.argv[1]), admin_url=sys.argv[2], drain_duration=1)
forked = fork_exec(envoy.command())
assert forked is not None, "fork_exec refused in a fresh single-threaded interpreter"
envoy.adopt(forked)

async def main() -> None:
    await envoy.start()
    print(json.dumps({"pid": envoy.pid, "agent": __import__("os").getpid()}), flush=True)
    await asyncio.sleep(3600)

uvloop.run(main())
"""


def _status(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return {k: v.strip() for k, v in (line.split(":", 1) for line in text.splitlines())}


async def test_fork_exec_sets_envoy_up_as_the_launcher_does(tmp_path: Path) -> None:
    """From a fresh interpreter, as `python -m agent` does: Envoy in its own session, stdin
    from /dev/null, and killed when the agent is (the parent-death signal, set before the
    exec); its ports are free for the next Envoy."""
    ip = pod_ip()
    boot = tmp_path / "envoy.json"
    boot.write_text(json.dumps(static_bootstrap(ip)))
    admin = f"http://{ip}:15000"
    async with envoy_owner(_OWNER, str(boot), admin, envoy_binary()) as (owner, line):
        pids = json.loads(line)
        pid = pids["pid"]
        assert pid != pids["agent"]
        # The owner reports the pid once it forked, and the child's exec may still be under
        # way: before it the child shows the owner's command line, mid-exec an empty one
        # (the new image's arguments are not laid out yet). Envoy's shows once it is done.
        cmdline = Path(f"/proc/{pid}/cmdline")
        await eventually(
            lambda: cmdline.read_bytes().split(b"\0")[0] == envoy_binary().encode(),
            timeout=10,
            what="Envoy exec'd",
        )
        assert os.getsid(pid) == pid  # a session of its own: the terminal's Ctrl-C is not its
        assert os.readlink(f"/proc/{pid}/fd/0") == os.devnull
        assert int(_status(pid)["PPid"]) == pids["agent"]

        await owner_killed_takes_envoy(owner, pid, boot, admin)


_REFUSE = """
import json, threading
from agent.envoy.earlystart import fork_exec
results = {}
gate = threading.Event()
t = threading.Thread(target=gate.wait)
t.start()
results["thread"] = fork_exec(["/bin/true"]) is None
gate.set(); t.join()
import grpc
results["grpc"] = fork_exec(["/bin/true"]) is None
print(json.dumps(results))
"""

_BAD_COMMAND = """
import os, sys
from agent.envoy.earlystart import fork_exec
forked = fork_exec([sys.argv[1]])
_, status = os.waitpid(forked.pid, 0)
print(os.waitstatus_to_exitcode(status))
print(os.read(forked.stderr, 4096).decode().strip())
"""


def test_fork_exec_refuses_beside_a_thread_or_grpc() -> None:
    out = _script(_REFUSE)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"thread": True, "grpc": True}


def test_a_command_that_cannot_be_exec_d_says_why_and_exits_127(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-envoy")
    out = _script(_BAD_COMMAND, missing)
    assert out.returncode == 0, out.stderr
    code, message = out.stdout.split("\n", 1)
    assert int(code) == EXEC_FAILED
    assert missing in message and "No such file" in message, message
    assert "Traceback" not in out.stdout + out.stderr


_SIGNALS = """
import os
from agent.envoy.earlystart import fork_exec
forked = fork_exec(["sleep", "30"])
while open(f"/proc/{forked.pid}/cmdline").read().split("\\0")[0] != "sleep":
    pass  # until exec'd
status = open(f"/proc/{forked.pid}/status").read()
os.kill(forked.pid, 9)
os.waitpid(forked.pid, 0)
print(dict(line.split(":", 1) for line in status.splitlines())["SigIgn"].strip())
"""


def test_the_signals_python_ignores_are_not_ignored_by_the_exec_d_program() -> None:
    """Python ignores SIGPIPE (and SIGXFSZ); a program exec'd from its fork would inherit
    that, as it would not from subprocess."""
    out = _script(_SIGNALS)
    assert out.returncode == 0, out.stderr
    ignored = int(out.stdout, 16)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        assert not ignored & (1 << (sig - 1)), (sig, hex(ignored))


_AS_USER = """
import os
from agent.envoy.earlystart import fork_exec
forked = fork_exec(["/bin/sh", "-c", "echo $(id -u) $(id -g) $(id -G) >&2"], (1337, 1337))
_, status = os.waitpid(forked.pid, 0)
print(os.waitstatus_to_exitcode(status))
print(os.read(forked.stderr, 4096).decode().strip())
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="switching user needs root")
def test_fork_exec_runs_the_command_as_the_proxy_user() -> None:
    """Interception mode REDIRECT: Envoy runs as 1337:1337 with no other group. Regression:
    the child loaded ctypes (for the parent-death signal) after switching user, which cannot
    read an interpreter installed under /root, and Envoy never started."""
    out = _script(_AS_USER)
    assert out.returncode == 0, out.stderr
    code, ids = out.stdout.split("\n", 1)
    assert (int(code), ids.strip()) == (0, "1337 1337 1337"), out.stdout


class _EmptyAds(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    """ADS answering each type's first request with an empty set (enough for Envoy to go
    LIVE); counts the streams."""

    def __init__(self) -> None:
        self.streams = 0

    async def StreamAggregatedResources(
        self, request_iterator: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[discovery_pb2.DiscoveryResponse]:
        self.streams += 1
        async for req in request_iterator:
            if not req.response_nonce:
                yield discovery_pb2.DiscoveryResponse(
                    type_url=req.type_url, version_info="1", nonce=req.type_url
                )


async def test_envoy_dialing_before_the_agent_bound_its_xds_socket_gets_its_config(
    tmp_path: Path,
) -> None:
    """Envoy now starts before the agent binds <workdir>/XDS: a first dial that finds no
    socket fails, and Envoy dials again (the bootstrap's retry policy: within 20 ms at
    first) and gets its config from the server bound later."""
    ip = pod_ip()
    cfg = AgentConfig(workdir=tmp_path / "run", ip=ip, pod_name="early-0", standard_metrics=False)
    cfg.workdir.mkdir()
    write_bootstrap(cfg.workdir / "envoy-rev.json", from_agent_config(cfg))
    envoy = EnvoySupervisor(
        envoy_binary(),
        cfg.workdir / "envoy-rev.json",
        admin_url=f"http://{ip}:{cfg.envoy_admin_port}",
        drain_duration=1.0,
        log_level="warning",
    )
    ads = _EmptyAds()
    server = grpc.aio.server()
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(ads, server)
    async with envoy:
        stat = f"{envoy.admin_url}/stats?filter=^cluster.xds-grpc.upstream_cx_connect_fail$"

        async def failed_dials() -> int | None:
            try:
                status, body = await fetch(stat, timeout=2)
            except (HttpClientError, OSError, TimeoutError):
                return None
            if status != 200 or b":" not in body:
                return None
            count = int(body.split(b":")[1])
            return count if count >= 2 else None

        # Dialed and failed, twice at least: the socket is not there yet.
        await eventually(failed_dials, timeout=20, what="Envoy's failed dials")
        assert not cfg.xds_socket.exists()
        server.add_insecure_port(f"unix:{cfg.xds_socket}")
        await server.start()
        try:

            async def live() -> bool:
                try:
                    status, body = await fetch(f"{envoy.admin_url}/ready", timeout=2)
                except (HttpClientError, OSError, TimeoutError):
                    return False
                return status == 200 and body.strip() == b"LIVE"

            await eventually(live, timeout=20, what="Envoy LIVE on the late socket's config")
            assert ads.streams >= 1
        finally:
            await server.stop(None)
