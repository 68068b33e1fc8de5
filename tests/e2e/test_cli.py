"""The commands as users run them: help, bad flags, bad config, clean shutdown, the demo."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
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


DEMO_ROOT = ROOT / "examples/local/demo-root.pem"
GATEWAY_IP, GATEWAY_HOST = "127.0.1.4", "demo.example.com"


def _demo_until_waiting(
    proc: subprocess.Popen[str], timeout: float
) -> tuple[list[str], threading.Thread]:
    """The demo's output so far, once it printed "Ctrl-C to stop" (it then serves until
    interrupted), and the thread that keeps appending the rest to it until the demo exits;
    fails with everything it printed if it exits first or takes longer."""
    lines: list[str] = []
    done = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "[demo] Ctrl-C to stop" in line:
                done.set()
        done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    done.wait(timeout)
    assert any("Ctrl-C to stop" in ln for ln in lines), "".join(lines)
    return lines, reader


def _gateway_https(path: str, context: ssl.SSLContext) -> tuple[int, dict[str, object], str]:
    """GET https://demo.example.com:8443`path` at the gateway's IP: SNI and Host are the
    name, the chain and hostname are verified by `context`; (status, body, leaf CN)."""
    raw = socket.create_connection((GATEWAY_IP, 8443), timeout=10)
    tls = context.wrap_socket(raw, server_hostname=GATEWAY_HOST)
    conn = http.client.HTTPConnection(GATEWAY_HOST, 8443, timeout=10)
    conn.sock = tls  # already connected: http.client sends Host demo.example.com:8443
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        subject = dict(x[0] for x in tls.getpeercert()["subject"])
        return r.status, json.loads(r.read()), str(subject.get("commonName"))
    finally:
        conn.close()


@pytest.mark.envoy
def test_make_demo_routes_traffic_through_the_mesh_and_its_gateway() -> None:
    """The demo as a user runs it: it checks its traffic, waits, answers the gateway curl
    lines it printed (HTTP, and HTTPS by SNI with the committed demo root), stops on Ctrl-C."""
    proc = subprocess.Popen(
        [sys.executable, "examples/local/demo.py"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    try:
        lines, reader = _demo_until_waiting(proc, timeout=90)
        # Through the gateway, from outside the demo: HTTP by Host header...
        request = urllib.request.Request(
            f"http://{GATEWAY_IP}:8080/reviews", headers={"Host": GATEWAY_HOST}
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            assert r.status == 200
            body = json.loads(r.read())
        assert (body["app"], body["path"]) == ("reviews", "/reviews"), body
        gateway_identity = "spiffe://cluster.local/ns/default/sa/ingress"
        assert body["caller"] == gateway_identity, body  # mTLS from the router to the sidecar
        # ...and HTTPS, the server verified against examples/local/demo-root.pem.
        verifying = ssl.create_default_context(cafile=str(DEMO_ROOT))
        status, body, subject = _gateway_https("/ratings", verifying)
        assert status == 200 and subject == GATEWAY_HOST
        assert (body["app"], body["path"], body["caller"]) == (
            "ratings",
            "/ratings",
            gateway_identity,
        ), body
        # Verification is real: without the demo root the same server is not trusted.
        with pytest.raises(ssl.SSLCertVerificationError):
            _gateway_https("/ratings", ssl.create_default_context())
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        reader.join(timeout=5)
        out = "".join(lines)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "'app': 'reviews'" in out and "'app': 'ratings'" in out
    # The demo's own gateway requests, the HTTPS one verified, reached the apps as the router.
    assert "(HTTP) -> {'app': 'reviews'" in out, out
    assert (
        "(HTTPS, SNI demo.example.com, chain verified against demo-root) -> {'app': 'ratings'"
        in out
    )
    assert out.count("'caller': 'spiffe://cluster.local/ns/default/sa/ingress'") == 2, out
    # The curl lines it prints are the README's.
    readme = (ROOT / "README.md").read_text()
    hints = [ln.split("[demo] try: ", 1)[1] for ln in out.splitlines() if "[demo] try: " in ln]
    assert len(hints) == 3 and all("curl " in h for h in hints), hints
    for hint in hints:
        assert hint in readme, hint
    # Registered through their WorkloadGroups, bound to their tokens' identities.
    assert "reviews-127.0.1.2 (default/reviews)" in out, out
    assert "ratings-127.0.1.3 (default/ratings)" in out, out
    assert "SYNCED" in out
    # How to see the traffic in Prometheus (the query is checked in test_observability).
    assert "examples/observability/prometheus-local.yml" in out
    assert "PromQL for the demo's traffic: sum by (" in out
    assert "[demo] stopped" in out


def _free_port() -> int:
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
