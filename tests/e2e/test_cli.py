"""The commands as users run them: help, bad flags, bad config, clean shutdown, the demo."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_control_help_explains_itself() -> None:
    r = run("-m", "control", "--help")
    assert r.returncode == 0
    for flag in ("--config", "--xds-address", "--http-address", "--log-format", "--trust-domain"):
        assert flag in r.stdout


def test_control_bad_flag_is_one_line_error() -> None:
    r = run("-m", "control", "--xds-address", "nonsense")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "is not HOST:PORT" in r.stderr


def test_control_bad_config_is_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  ports: [{port: 99999}]\n"
    )
    r = run(
        "-m",
        "control",
        "--config",
        str(bad),
        "--xds-address",
        "127.0.0.1:0",
        "--http-address",
        "127.0.0.1:0",
    )
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("pilotfish-control:")]
    assert len(lines) == 1 and f"{bad}:6:" in lines[0], r.stderr


def test_control_missing_config_path_is_one_line_error(tmp_path: Path) -> None:
    r = run(
        "-m",
        "control",
        "--config",
        str(tmp_path / "nope"),
        "--xds-address",
        "127.0.0.1:0",
        "--http-address",
        "127.0.0.1:0",
    )
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and "nope" in r.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_control_exits_zero_on_signal(tmp_path: Path, sig: signal.Signals) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "control",
            "--config",
            str(ROOT / "examples/local/mesh.yaml"),
            "--xds-address",
            "127.0.0.1:0",
            "--http-address",
            f"127.0.0.1:{port}",
            "--webhook-address",
            "off",
            "--secure-xds-address",
            "127.0.0.1:0",
            "--state-dir",
            str(tmp_path / "state"),
            "--log-format",
            "json",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        else:
            raise AssertionError("control plane never became ready")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
        assert '"level": "info"' in err  # json log format is honoured
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.envoy
def test_make_demo_routes_traffic_and_stops_cleanly() -> None:
    env = dict(os.environ)
    r = subprocess.run(
        [sys.executable, "examples/local/demo.py", "--once"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "'app': 'reviews'" in r.stdout and "'app': 'ratings'" in r.stdout
    # Registered through their WorkloadGroups, bound to their tokens' identities.
    assert "reviews-127.0.1.2 (default/reviews)" in r.stdout, r.stdout
    assert "ratings-127.0.1.3 (default/ratings)" in r.stdout, r.stdout
    assert "SYNCED" in r.stdout
    # How to see the traffic in Prometheus (the query is checked in test_observability).
    assert "examples/observability/prometheus-local.yml" in r.stdout
    assert "PromQL for the demo's traffic: sum by (" in r.stdout
    assert "[demo] stopped" in r.stdout


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_ctl_version_and_bad_input() -> None:
    r = run("-m", "control.ctl", "version")
    assert r.returncode == 0 and r.stdout.startswith("pilotfish-ctl ")
    r = run("-m", "control.ctl", "proxy-status", "--xds-address", "nonsense")
    assert r.returncode == 2 and "HOST:PORT" in r.stderr and "Traceback" not in r.stderr
    r = run("-m", "control.ctl", "proxy-config", "bogus", "127.0.0.1")
    assert r.returncode == 2 and "invalid choice" in r.stderr and "Traceback" not in r.stderr


def test_agent_help_and_bad_flags() -> None:
    r = run("-m", "agent", "--help")
    assert r.returncode == 0
    for flag in ("--control-plane", "--workdir", "--ip", "--proxy-only", "--drain-duration"):
        assert flag in r.stdout
    r = run("-m", "agent", "--ip", "not-an-ip")
    assert r.returncode == 2 and "--ip" in r.stderr and "Traceback" not in r.stderr
    r = run("-m", "agent", "--control-plane", "nohost")
    assert r.returncode == 2 and "HOST:PORT" in r.stderr
