"""Run `pilotfish-control` as a real subprocess (a replica that a test can kill outright)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]


class ControlPlaneProcess:
    """One replica: plaintext xDS (debugging: proxy-status), the TLS port (agents) and HTTP
    on fresh ports of 127.0.0.1."""

    def __init__(self, replica_id: str, log_dir: Path, *args: str) -> None:
        self.id = replica_id
        self.xds_port = free_port()
        self.secure_port = free_port()
        self.http_port = free_port()
        self.log_path = log_dir / f"{replica_id}.log"
        self.args = [
            sys.executable,
            "-m",
            "control",
            "--id",
            replica_id,
            "--xds-address",
            f"127.0.0.1:{self.xds_port}",
            "--webhook-address",
            "off",
            "--secure-xds-address",
            f"127.0.0.1:{self.secure_port}",
            "--http-address",
            f"127.0.0.1:{self.http_port}",
            "--debounce-after",
            "0.05",
            "--debounce-max",
            "1",
            *args,
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def xds(self) -> str:
        return f"127.0.0.1:{self.xds_port}"

    @property
    def secure_xds(self) -> str:
        return f"127.0.0.1:{self.secure_port}"

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.args,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            start_new_session=True,
        )
        log.close()

    def is_ready(self) -> bool:
        """GET /ready (blocking: call through asyncio.to_thread)."""
        try:
            with urllib.request.urlopen(f"http://{self.http}/ready", timeout=1) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        """SIGKILL: the replica vanishes without closing its streams (a crashed node)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
