"""A real Prometheus (Debian's `prometheus` package, `.ci/sysdeps`) for tests: started on a
loopback address with a static scrape config and a short interval, queried over its HTTP API."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import textwrap
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.support.net import free_port, pod_ip


def prometheus_binary() -> str:
    found = shutil.which("prometheus") or shutil.which("prometheus", path="/usr/bin")
    if not found:
        raise RuntimeError("prometheus not installed (make sysdeps installs Debian's package)")
    return found


class PrometheusServer:
    def __init__(
        self,
        workdir: Path,
        targets: Sequence[str],
        *,
        metrics_path: str = "/stats/prometheus",
        interval: str = "1s",
    ) -> None:
        """`targets`: `host:port` of the endpoints to scrape at `metrics_path`."""
        self.workdir = workdir
        self.host = pod_ip()
        self.port = free_port(self.host)
        self.url = f"http://{self.host}:{self.port}"
        self.log_path = workdir / "prometheus.log"
        shown = ", ".join(f'"{t}"' for t in targets)
        self.config = textwrap.dedent(
            f"""\
            global:
              scrape_interval: {interval}
              evaluation_interval: {interval}
            scrape_configs:
            - job_name: sidecars
              metrics_path: {metrics_path}
              static_configs:
              - targets: [{shown}]
            """
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(self.config)
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                prometheus_binary(),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address={self.host}:{self.port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except OSError:
            return 0, b""

    async def ready(self) -> bool:
        status, _ = await asyncio.to_thread(self._get, "/-/ready")
        return status == 200

    async def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector `promql` evaluates to now (Prometheus' /api/v1/query)."""
        status, body = await asyncio.to_thread(
            self._get, "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        )
        if status != 200:
            raise AssertionError(f"query {promql!r}: HTTP {status}: {body[:500]!r}")
        data = json.loads(body)
        assert data["status"] == "success", data
        return list(data["data"]["result"])

    async def value(self, promql: str) -> float | None:
        """The single value `promql` evaluates to, None when the result is empty."""
        result = await self.query(promql)
        if not result:
            return None
        assert len(result) == 1, result
        return float(result[0]["value"][1])

    async def targets_up(self) -> int:
        return len(await self.query("up == 1"))
