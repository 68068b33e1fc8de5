"""`pilotfish-control --mesh-config`: a bad file at startup is one `file:line` line and exit 1;
the file's settings apply (trust domain, outbound traffic policy) unless a flag says
otherwise; /debug/configz shows what is in effect."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.e2e.test_cli import ROOT, run
from tests.support.net import free_port


def test_bad_mesh_config_is_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "mesh.yaml"
    bad.write_text("accessLogFile: /dev/stdout\noutboundTrafficPolicy: {mode: SOMETIMES}\n")
    r = run(
        "-m",
        "control",
        "--mesh-config",
        str(bad),
        "--xds-address",
        "127.0.0.1:0",
        "--http-address",
        "127.0.0.1:0",
        "--secure-xds-address",
        "off",
        "--webhook-address",
        "off",
        "--state-dir",
        str(tmp_path / "state"),
    )
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("pilotfish-control:")]
    assert len(lines) == 1 and f"{bad}:2:" in lines[0], r.stderr
    assert "outboundTrafficPolicy.mode" in lines[0]


def configz(*flags: str, mesh: Path, tmp_path: Path) -> dict[str, object]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "control",
            "--mesh-config",
            str(mesh),
            "--xds-address",
            "127.0.0.1:0",
            "--http-address",
            f"127.0.0.1:{port}",
            "--webhook-address",
            "off",
            "--secure-xds-address",
            "off",
            "--state-dir",
            str(tmp_path / "state"),
            *flags,
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/debug/configz", timeout=1
                ) as r:
                    body = json.loads(r.read())
                    mesh_config = body["mesh_config"]
                    assert isinstance(mesh_config, dict)
                    return mesh_config
            except OSError:
                time.sleep(0.1)
        raise AssertionError("control plane never served /debug/configz")
    finally:
        proc.terminate()
        proc.communicate(timeout=15)


def test_mesh_config_applies_and_flags_win(tmp_path: Path) -> None:
    mesh = tmp_path / "mesh.yaml"
    mesh.write_text(
        "trustDomain: example.org\noutboundTrafficPolicy: {mode: REGISTRY_ONLY}\n"
        "accessLogFile: /dev/stdout\n"
    )
    from_file = configz(mesh=mesh, tmp_path=tmp_path)["in_effect"]
    assert isinstance(from_file, dict)
    assert from_file["trust_domain"] == "example.org"
    assert from_file["outbound_traffic_policy"] == "REGISTRY_ONLY"
    assert from_file["access_log_file"] == "/dev/stdout"
    flagged = configz(
        "--trust-domain",
        "flag.local",
        "--outbound-traffic-policy",
        "ALLOW_ANY",
        mesh=mesh,
        tmp_path=tmp_path,
    )["in_effect"]
    assert isinstance(flagged, dict)
    assert flagged["trust_domain"] == "flag.local"
    assert flagged["outbound_traffic_policy"] == "ALLOW_ANY"
    assert flagged["access_log_file"] == "/dev/stdout"  # no flag for it: the file's
