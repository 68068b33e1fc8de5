"""Run `pilotfish-control` as a real subprocess for tests that kill it (`kill -9`) and
restart it on the same ports and state dir."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]


class ControlProcess:
    def __init__(
        self, config: Path, state_dir: Path, log_path: Path, *extra: str, xds_port: int = 0
    ) -> None:
        """Fixed ports (picked now, kept across restarts) so agents dial the same address."""
        self.xds_port = xds_port or free_port()
        self.secure_port = free_port()
        self.http_port = free_port()
        self.state_dir = state_dir
        self.log_path = log_path
        self.args = [
            sys.executable,
            "-m",
            "control",
            "--config",
            str(config),
            "--state-dir",
            str(state_dir),
            "--xds-address",
            f"127.0.0.1:{self.xds_port}",
            "--secure-xds-address",
            f"127.0.0.1:{self.secure_port}",
            # Its default port is fixed (15017): another control plane on this machine would
            # make the start fail.
            "--webhook-address",
            "off",
            "--http-address",
            f"127.0.0.1:{self.http_port}",
            "--debounce-after",
            "0.05",
            "--debounce-max",
            "1",
            "--id",
            "chaos-cp",
            *extra,
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        """The plaintext port (debugging: syncz, proxy-status; it registers nothing)."""
        return f"127.0.0.1:{self.xds_port}"

    @property
    def secure_target(self) -> str:
        """The TLS port, where agents connect (verified by `root`)."""
        return f"127.0.0.1:{self.secure_port}"

    @property
    def root(self) -> Path:
        """The state dir's root certificate (written on the first start, kept after)."""
        return self.state_dir / "root-cert.pem"

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.args,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            start_new_session=True,
        )
        log.close()

    def kill(self) -> None:
        """`kill -9`: no drain, no goodbye to the streams."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def terminate(self, timeout: float = 20) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def rss_bytes(self) -> int:
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def http(self, path: str) -> tuple[int, bytes]:
        """GET on the debug server (blocking: call through asyncio.to_thread)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=2) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except OSError:
            return 0, b""

    def ready(self) -> bool:
        return self.http("/ready")[0] == 200

    def syncz(self) -> list[dict[str, Any]]:
        status, body = self.http("/debug/syncz")
        return list(json.loads(body)) if status == 200 else []
