"""Run `pilotfish-agent` as a real subprocess for tests (one per pod IP)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class AgentProcess:
    def __init__(
        self,
        control_plane: str,
        workdir: Path,
        ip: str,
        pod: str,
        labels: str = "",
        *extra: str,
        token: str | None = None,
        env: dict[str, str] | None = None,
        wrap: Sequence[str] = (),
        log_path: Path | None = None,
    ) -> None:
        """`token`: written to `<workdir>/token` (the agent's default --token-file) before
        the agent starts, so it can get its workload certificate. `env`: extra environment
        (e.g. ISTIO_META_* node metadata). `wrap`: a command prefix, e.g. `ip netns exec NS`
        to run the agent inside a network-namespace pod."""
        self.ip = ip
        self.extra_env = dict(env or {})
        self.token = token
        self.workdir = workdir
        self.log_path = log_path or workdir.parent / f"{pod}-agent.log"
        self.args = [
            *wrap,
            sys.executable,
            "-m",
            "agent",
            "--control-plane",
            control_plane,
            "--workdir",
            str(workdir),
            "--ip",
            ip,
            "--pod-name",
            pod,
            "--labels",
            labels,
            "--drain-duration",
            "1",
            *extra,
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.token is not None:
            token_file = self.workdir / "token"
            token_file.write_text(self.token)
            token_file.chmod(0o600)
        log = self.log_path.open("wb")
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.extra_env)
        self.proc = subprocess.Popen(
            self.args,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        log.close()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def terminate(self, timeout: float = 20) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
