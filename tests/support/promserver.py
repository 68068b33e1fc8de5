"""A real Prometheus (Debian's `prometheus` package, installed by .ci/sysdeps) started on a
loopback address for a test, with its HTTP API."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tests.support.net import free_port, pod_ip


def prometheus_binary() -> str:
    found = shutil.which("prometheus") or shutil.which("prometheus", path="/usr/bin")
    assert found, "prometheus is not installed (Debian package prometheus; see .ci/sysdeps)"
    return found


def promtool_binary() -> str:
    found = shutil.which("promtool") or shutil.which("promtool", path="/usr/bin")
    assert found, "promtool is not installed (Debian package prometheus; see .ci/sysdeps)"
    return found


class Prometheus:
    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url = url
        self._session = session

    async def api(self, path: str, **params: str) -> dict[str, Any]:
        """GET /api/v1/<path>: the JSON answer, errors included (bad PromQL is a 400 with
        status "error")."""
        async with self._session.get(f"{self.url}/api/v1/{path}", params=params) as r:
            answer: dict[str, Any] = await r.json(content_type=None)
            return answer

    async def query(self, expr: str) -> dict[str, Any]:
        return await self.api("query", query=expr)

    async def vector(self, expr: str) -> list[dict[str, Any]]:
        answer = await self.query(expr)
        assert answer["status"] == "success", (expr, answer)
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result


@asynccontextmanager
async def running_prometheus(config: dict[str, Any], workdir: Path) -> AsyncIterator[Prometheus]:
    """Prometheus with `config` (a parsed prometheus.yml) on a fresh loopback address."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    ip = pod_ip()
    address = f"{ip}:{free_port(ip)}"
    log = (workdir / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            prometheus_binary(),
            f"--config.file={config_file}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address={address}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    url = f"http://{address}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            deadline = time.monotonic() + 30
            while True:
                assert proc.poll() is None, (workdir / "prometheus.log").read_text()
                try:
                    async with session.get(f"{url}/-/ready") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                assert time.monotonic() < deadline, "prometheus did not become ready"
                await asyncio.sleep(0.1)
            yield Prometheus(url, session)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
