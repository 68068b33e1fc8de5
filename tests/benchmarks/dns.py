"""Benchmark: the agent's DNS server against dnsmasq serving the same names, same run.

Both servers run on one core (taskset -c 0), dnsperf on the other (taskset -c 1). The agent
is a real `python -m agent --proxy-only` subprocess whose name table comes from an in-process
control plane over NDS; dnsmasq answers the same names with the same address from a hosts
file. Figures:

(a) peak QPS of each (dnsperf with many queries outstanding), and the ratio (target >= 0.5);
(b) p99 latency of the agent at half of its own peak rate (target <= 2 ms), dnsmasq's at the
    same rate for reference.

Needs dnsperf and dnsmasq (`make sysdeps`). `--duration` shortens the runs for a quick look.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from control.app import ControlPlane, ControlPlaneOptions
from control.ca.identity import Identity

AGENT_IP = "127.53.0.1"
DNSMASQ_IP = "127.53.0.2"
PORT = 15053
STATUS_PORT = 15020


def mesh_yaml(services: int) -> str:
    return "---\n".join(
        f"apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{s}, namespace: ns-{s % 10}}}\n"
        f"spec:\n  selector: {{app: svc-{s}}}\n  ports: [{{name: http, port: 9080}}]\n"
        for s in range(services)
    )


def names(services: int) -> list[str]:
    return [f"svc-{s}.ns-{s % 10}.svc.cluster.local" for s in range(services)]


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        sys.exit(f"dns benchmark: {tool} is not installed (run `make sysdeps`)")
    return path


def cores() -> tuple[list[str], list[str]]:
    """taskset prefixes: the server on core 0, dnsperf on core 1 (when there are two)."""
    if shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        return [], []
    return ["taskset", "-c", "0"], ["taskset", "-c", "1"]


def dnsperf(ip: str, queries: Path, duration: float, qps: int = 0) -> tuple[float, list[float]]:
    """(QPS achieved, latencies in seconds when rate-limited)."""
    _, client = cores()
    args = [*client, need("dnsperf"), "-s", ip, "-p", str(PORT), "-d", str(queries)]
    args += ["-l", str(duration), "-t", "2"]
    if qps:
        args += ["-Q", str(qps), "-q", "1000", "-v"]  # -v: one line (with latency) per query
    else:
        args += ["-q", "500"]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    m = re.search(r"Queries per second:\s+([\d.]+)", out)
    lost = re.search(r"Queries lost:\s+(\d+)", out)
    if m is None:
        raise RuntimeError(f"dnsperf output not understood:\n{out}")
    if lost and int(lost.group(1)) and qps:
        print(f"  (dnsperf lost {lost.group(1)} queries against {ip})")
    latencies = [float(x) for x in re.findall(r"^> \w+ \S+ \S+ ([\d.]+)$", out, re.M)]
    return float(m.group(1)), latencies


def p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def wait_http(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout}s")


def wait_dns(ip: str, timeout: float = 10) -> None:
    from dnslib import DNSRecord

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            reply = DNSRecord.question("svc-0.ns-0.svc.cluster.local").send(ip, PORT, timeout=0.5)
            if DNSRecord.parse(reply).rr:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"no DNS answer from {ip}:{PORT}")


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    server, _ = cores()
    with log.open("wb") as f:
        return subprocess.Popen([*server, *args], stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per dnsperf run")
    ap.add_argument("--services", type=int, default=200)
    args = ap.parse_args()
    need("dnsperf")
    need("dnsmasq")
    tmp = Path(tempfile.mkdtemp(prefix="pf-dns-"))
    (tmp / "mesh.yaml").write_text(mesh_yaml(args.services))
    queries = tmp / "queries.txt"
    queries.write_text("".join(f"{n} A\n" for n in names(args.services)))
    hosts = tmp / "hosts"
    hosts.write_text("".join(f"{AGENT_IP} {n}\n" for n in names(args.services)))

    cp = ControlPlane(
        ControlPlaneOptions(
            config_paths=(str(tmp / "mesh.yaml"),),
            xds_address="127.0.0.1:0",
            secure_xds_address="127.0.0.1:0",
            http_address="127.0.0.1:0",
        )
    )
    await cp.start()
    # The TLS port and a token, so the agent gets its certificate and turns ready, as a real
    # one does (the plaintext port signs no certificates).
    assert cp.tokens is not None and cp.ca is not None
    (tmp / "root-cert.pem").write_text(cp.ca.root_pem)
    (tmp / "agent").mkdir()
    (tmp / "agent" / "token").write_text(
        cp.tokens.issue(Identity("default", "default"), 3600, time.time())
    )
    agent = dnsmasq = None
    try:
        agent = start(
            [
                sys.executable,
                "-m",
                "agent",
                "--proxy-only",
                "--control-plane",
                f"127.0.0.1:{cp.secure_xds_port}",
                "--ca-root-cert",
                str(tmp / "root-cert.pem"),
                "--workdir",
                str(tmp / "agent"),
                "--ip",
                AGENT_IP,
                "--pod-name",
                "bench",
                "--dns-port",
                str(PORT),
                "--dns-upstream",
                "127.0.0.1:9",  # nothing is forwarded in this benchmark
                "--log-level",
                "warning",
            ],
            tmp / "agent.log",
        )
        dnsmasq = start(
            [
                need("dnsmasq"),
                "--keep-in-foreground",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                f"--addn-hosts={hosts}",
                f"--listen-address={DNSMASQ_IP}",
                "--bind-interfaces",
                f"--port={PORT}",
                "--user=root",
                "--pid-file",
                "--cache-size=10000",
                "--local-ttl=30",
            ],
            tmp / "dnsmasq.log",
        )
        await asyncio.to_thread(wait_http, f"http://{AGENT_IP}:{STATUS_PORT}/healthz/ready")
        await asyncio.to_thread(wait_dns, AGENT_IP)
        await asyncio.to_thread(wait_dns, DNSMASQ_IP)
        # A short warm-up of each, then the measured runs.
        for ip in (AGENT_IP, DNSMASQ_IP):
            await asyncio.to_thread(dnsperf, ip, queries, min(2.0, args.duration))
        ours, _ = await asyncio.to_thread(dnsperf, AGENT_IP, queries, args.duration)
        theirs, _ = await asyncio.to_thread(dnsperf, DNSMASQ_IP, queries, args.duration)
        half = max(1, int(ours / 2))
        _, lat_ours = await asyncio.to_thread(dnsperf, AGENT_IP, queries, args.duration, half)
        _, lat_theirs = await asyncio.to_thread(dnsperf, DNSMASQ_IP, queries, args.duration, half)
    finally:
        for proc in (agent, dnsmasq):
            if proc is not None:
                stop(proc)
        await cp.close(0)
    print(
        f"dns (a) peak QPS agent: {ours:,.0f}, dnsmasq: {theirs:,.0f}, ratio"
        f" {ours / theirs:.2f}  (target >= 0.5)"
    )
    print(
        f"dns (b) p99 latency at {half:,} QPS (half the agent's peak) agent:"
        f" {p99(lat_ours) * 1000:.2f} ms, dnsmasq: {p99(lat_theirs) * 1000:.2f} ms"
        "  (target <= 2 ms)"
    )


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
