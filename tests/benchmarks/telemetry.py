"""Benchmark: the cost of telemetry (Istio's standard metrics, counted by the agent from
Envoy's records, and access logs) on traffic between two pods.

Two pods (agent + Envoy each, mTLS between them), the backend app a plain Envoy answering 200
itself (so the app is never the bottleneck). h2load drives the client's sidecar; the same run
measures two such pairs: one with all telemetry off (the floor: `--standard-metrics off`, no
access log) and one with the standard metrics and access logs on, as an Istio user turns
access logs on for some workloads: an `envoyFileAccessLog` provider in the mesh config (a
file in the temp dir per pod, as each pod has its own; Istio's default TEXT format) and a
Telemetry selecting the pod names it. The run fails unless each of the "on" pair's two files
holds every request of that pair, and none of the "off" pair's.

(a) throughput with telemetry / without (target >= 0.85) and p99 latency with / without
    (<= 1.3);
(b) agent CPU per 10,000 requests with telemetry on (client and backend agents), and the two
    sidecars' Envoy CPU per request with it and without (what a busy shared machine
    disturbs far less than the rates: read it beside (a));
(c) agent RSS before and after `--paths-requests` requests across 5,000 distinct paths: the
    label sets do not grow with paths, so neither does memory (target: series unchanged,
    RSS growth <= 20 MB).

Prints one line per figure.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.benchmarks.procstat import cpu_seconds, envoy_pid, load_average, rss_mb
from tests.support.agentproc import AgentProcess
from tests.support.controlplane import eventually, running_control_plane
from tests.support.envoy import EnvoyProcess
from tests.support.mesh import backend_yaml, mesh_agent
from tests.support.net import free_port, pod_ip

STRICT = """apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: default}
spec: {mtls: {mode: STRICT}}
"""

# Pods with access logs carry the label `access-log: <role>`; a Telemetry per role selects
# them and names the provider of the role's file.
ROLES = ("client", "backend")
ACCESS_LOG = """apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {{name: {role}-log, namespace: default}}
spec:
  selector: {{matchLabels: {{access-log: {role}}}}}
  accessLogging: [{{providers: [{{name: {role}-log}}]}}]
"""


def mesh_config(logs: dict[str, Path]) -> str:
    return "extensionProviders:\n" + "".join(
        f"- name: {role}-log\n  envoyFileAccessLog: {{path: {path}}}\n"
        for role, path in logs.items()
    )


def direct_app(ip: str, port: int, workdir: Path) -> EnvoyProcess:
    """An HTTP/1.1 and h2 server that answers `ok` itself: an Envoy with a direct response."""
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager."
        "v3.HttpConnectionManager",
        "stat_prefix": "app",
        "codec_type": "AUTO",
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "app",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/"},
                            "direct_response": {"status": 200, "body": {"inline_string": "ok"}},
                        }
                    ],
                }
            ]
        },
        "http_filters": [
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            }
        ],
    }
    bootstrap = {
        "admin": {"address": {"socket_address": {"address": ip, "port_value": free_port(ip)}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "app",
                    "address": {"socket_address": {"address": ip, "port_value": port}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": hcm,
                                }
                            ]
                        }
                    ],
                }
            ]
        },
    }
    return EnvoyProcess(bootstrap, workdir, name="app")


def h2load(
    url: str,
    requests: int,
    log: Path,
    *,
    authority: str,
    clients: int,
    streams: int,
    uris: Path | None = None,
) -> tuple[float, float, int]:
    """(requests/s, p99 ms, 2xx) for one h2load run (h2c, prior knowledge)."""
    log.unlink(missing_ok=True)  # h2load appends
    args = [
        "h2load",
        "-n",
        str(requests),
        "-c",
        str(clients),
        "-m",
        str(streams),
        # h2load speaks h2c (prior knowledge): the authority routes, not a Host header.
        "-H",
        f":authority: {authority}",
        f"--log-file={log}",
    ]
    args += ["-i", str(uris)] if uris is not None else [url]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=900).stdout
    rate = next(
        float(line.split(",")[1].split()[0])
        for line in out.splitlines()
        if line.startswith("finished in")
    )
    durations = []
    ok = 0
    for line in log.read_text().splitlines():
        _, status, micros = line.split("\t")
        durations.append(int(micros) / 1000)
        ok += status.startswith("2")
    p99 = statistics.quantiles(durations, n=100)[98]
    return rate, p99, ok


def scrape(ip: str) -> str:
    with urllib.request.urlopen(f"http://{ip}:15020/stats/prometheus", timeout=5) as r:
        return str(r.read().decode())


def envoy_stat(ip: str, name: str) -> float:
    with urllib.request.urlopen(f"http://{ip}:15000/stats?filter=^{name}$", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.split(": ")[1]) for line in text.splitlines() if ": " in line)


def access_log_lines(path: Path) -> dict[str, int]:
    """Access log lines by the authority, the sixth quoted field of Istio's TEXT format
    (`backend-on` or `backend-off`); "" for a line that is not in that format."""
    counts: dict[str, int] = {}
    if not path.exists():
        return counts
    with path.open(errors="replace") as f:
        for line in f:
            quoted = line.split('"')
            authority = quoted[11] if len(quoted) > 11 else ""
            counts[authority] = counts.get(authority, 0) + 1
    return counts


def sample(text: str, name: str, having: str = "") -> float:
    """The sum of `name`'s samples (those whose labels hold `having`, when given)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if having in line.partition(" ")[0]:
                total += float(line.rsplit(" ", 1)[1])
    return total


class Pair:
    """A client pod and a backend pod (service `backend-<name>`), metrics on or off."""

    def __init__(self, name: str, metrics: bool, logs: bool, tmp: Path) -> None:
        self.name = name
        self.metrics = metrics
        self.logs = logs
        self.host = f"backend-{name}"
        self.client_ip, self.backend_ip = pod_ip(), pod_ip()
        self.app = direct_app(self.backend_ip, 8080, tmp / f"app-{name}")
        self.url = f"http://{self.client_ip}:9080/bench"
        self.agents: list[AgentProcess] = []
        self.cpu = {"client": 0.0, "backend": 0.0}
        self.envoy_cpu = {"client": 0.0, "backend": 0.0}
        self.rates: list[float] = []
        self.p99s: list[float] = []

    def start(self, cp: object, tmp: Path) -> None:
        self.app.start()
        flag = ("--standard-metrics", "on" if self.metrics else "off")
        logs = {r: f",access-log={r}" if self.logs else "" for r in ROLES}
        labels = f"app={self.host}{logs['backend']}"
        self.backend = mesh_agent(
            cp,  # type: ignore[arg-type]
            tmp,
            self.backend_ip,
            f"{self.host}-0",
            labels,
            *flag,
            group=self.host,
        )
        self.client = mesh_agent(
            cp,  # type: ignore[arg-type]
            tmp,
            self.client_ip,
            f"client-{self.name}",
            f"app=client{logs['client']}",
            *flag,
        )
        self.agents = [self.backend, self.client]
        for a in self.agents:
            a.start()

    def stop(self) -> None:
        for a in self.agents:
            a.kill()
        self.app.stop()

    def pids(self) -> dict[str, int]:
        assert self.client.proc is not None and self.backend.proc is not None
        return {"client": self.client.proc.pid, "backend": self.backend.proc.pid}

    def envoy_pids(self) -> dict[str, int]:
        return {k: envoy_pid(pid) for k, pid in self.pids().items()}

    def reachable(self) -> bool:
        try:
            req = urllib.request.Request(self.url, headers={"Host": self.host})
            with urllib.request.urlopen(req, timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def load(
        self, requests: int, log: Path, args: argparse.Namespace, uris: Path | None = None
    ) -> tuple[float, float]:
        rate, p99, ok = h2load(
            self.url,
            requests,
            log,
            authority=self.host,
            clients=args.clients,
            streams=args.streams,
            uris=uris,
        )
        if ok != requests:
            raise SystemExit(f"{self.name}: only {ok} of {requests} requests answered 2xx")
        return rate, p99


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--requests", type=int, default=20_000, help="per round and side")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--paths-requests", type=int, default=200_000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--streams", type=int, default=10)
    p.add_argument(
        "--on",
        choices=("metrics,logs", "metrics", "logs"),
        default="metrics,logs",
        help="what the \"on\" pair turns on (one alone: that part's cost; not the target's figure)",
    )
    args = p.parse_args()
    t0 = time.monotonic()
    loads = [load_average()]
    with tempfile.TemporaryDirectory(prefix="pf-telemetry-") as d:
        tmp = Path(d)
        cfg = tmp / "cfg"
        cfg.mkdir()
        (cfg / "mesh.yaml").write_text(
            "---\n".join(
                [
                    backend_yaml("backend-off"),
                    backend_yaml("backend-on"),
                    STRICT,
                    *(ACCESS_LOG.format(role=r) for r in ROLES),
                ]
            )
        )
        access_logs = {r: tmp / f"access-{r}-on.log" for r in ROLES}
        mesh_file = tmp / "meshconfig.yaml"
        mesh_file.write_text(mesh_config(access_logs))
        on_metrics, on_logs = "metrics" in args.on, "logs" in args.on
        off, on = Pair("off", False, False, tmp), Pair("on", on_metrics, on_logs, tmp)
        async with running_control_plane(cfg, mesh_config=mesh_file) as cp:
            try:
                for pair in (off, on):
                    pair.start(cp, tmp)
                for pair in (off, on):
                    await eventually(
                        lambda pair=pair: asyncio.to_thread(pair.reachable),  # type: ignore[misc]
                        timeout=60,
                        what=f"traffic {pair.name}",
                    )
                    # Warm-up: connections, the streams to the agents, first allocations.
                    await asyncio.to_thread(pair.load, 2000, tmp / f"warm-{pair.name}.log", args)
                # Alternating rounds, so the machine's other load falls on both sides alike;
                # each side's best round is its figure.
                for r in range(args.rounds):
                    # Which side goes first alternates too (no position advantage).
                    for pair in (off, on) if r % 2 == 0 else (on, off):
                        before = {k: cpu_seconds(pid) for k, pid in pair.pids().items()}
                        envoys = pair.envoy_pids()
                        envoy_before = {k: cpu_seconds(pid) for k, pid in envoys.items()}
                        rate, p99 = await asyncio.to_thread(
                            pair.load, args.requests, tmp / f"{pair.name}-{r}.log", args
                        )
                        # The last batches reach the agent within the flush interval.
                        await asyncio.sleep(1.5)
                        for k, pid in pair.pids().items():
                            pair.cpu[k] += cpu_seconds(pid) - before[k]
                        for k, pid in envoys.items():
                            pair.envoy_cpu[k] += cpu_seconds(pid) - envoy_before[k]
                        pair.rates.append(rate)
                        pair.p99s.append(p99)
                    loads.append(load_average())
                backend_metrics = scrape(on.backend_ip)
                counted = sample(backend_metrics, "istio_requests_total")
                # The backend names its caller (from the peer table, not from anything the
                # caller sends): what is measured is the full label set, not `unknown`.
                named = sample(
                    backend_metrics,
                    "istio_requests_total",
                    f'source_workload="client-{on.name}"',
                )
                # Envoy flushed its file within the 1.5 s the last round waited.
                logged = {
                    r: await asyncio.to_thread(access_log_lines, path)
                    for r, path in access_logs.items()
                }
                # Entries Envoy's gRPC logger dropped (TCP now) and HTTP records the agent
                # could not read.
                dropped = {
                    k: envoy_stat(ip, "access_logs.grpc_access_log.logs_dropped")
                    + sample(scrape(ip), "pilotfish_agent_metrics_records_dropped_total")
                    for k, ip in (("client", on.client_ip), ("backend", on.backend_ip))
                }
                uris = tmp / "uris.txt"
                uris.write_text("".join(f"{on.url}/p/{i}\n" for i in range(5000)))
                rss0 = {k: rss_mb(pid) for k, pid in on.pids().items()}
                series0 = sample(scrape(on.backend_ip), "pilotfish_agent_metrics_series")
                await asyncio.to_thread(on.load, args.paths_requests, tmp / "paths.log", args, uris)
                await asyncio.sleep(1.5)
                rss1 = {k: rss_mb(pid) for k, pid in on.pids().items()}
                series1 = sample(scrape(on.backend_ip), "pilotfish_agent_metrics_series")
            finally:
                off.stop()
                on.stop()
    total = args.requests * args.rounds
    print(
        "telemetry load average (1/5/15 min) at the start and after each round: "
        + " | ".join(loads)
    )
    # Each request of the "on" pair once in each sidecar's file (the readiness probes may add
    # a few); a line of the "off" pair's, or one not in Istio's format, is a failure.
    want = total + 2000 if on.logs else 0
    for role, counts in logged.items():
        lines_on, lines_off = counts.pop(on.host, 0), counts.pop(off.host, 0)
        print(
            f"telemetry access log ({role} sidecar): {lines_on} lines for {on.host} (>= "
            f"{want}: rounds and warm-up), {lines_off} for {off.host} (0), "
            f"{sum(counts.values())} other (0)"
        )
        if lines_on < want or lines_off or sum(counts.values()) or (lines_on and not on.logs):
            raise SystemExit(
                f"telemetry: the access log {access_logs[role]} is not what was asked for"
            )
    what = " + ".join(
        name for name, on_ in (("metrics", on.metrics), ("access logs", on.logs)) if on_
    )
    ratio = max(on.rates) / max(off.rates)
    p99_ratio = min(on.p99s) / min(off.p99s)
    print(
        f"telemetry throughput with {what} / all telemetry off: "
        f"{max(on.rates):.0f} / {max(off.rates):.0f} req/s = {ratio:.2f} (target >= 0.85; "
        f"best of {args.rounds} alternating rounds)"
    )
    print(
        f"telemetry p99 with {what} / all telemetry off: {min(on.p99s):.2f} /"
        f" {min(off.p99s):.2f} ms = {p99_ratio:.2f} (target <= 1.3)"
    )
    for side in ("client", "backend"):
        print(
            f"telemetry agent CPU ({side}): {on.cpu[side] / total * 10_000:.3f} s per 10,000 "
            f"requests with telemetry ({off.cpu[side] / total * 10_000:.3f} s without)"
        )
    for side in ("client", "backend"):
        e_on, e_off = (p.envoy_cpu[side] / total * 1e6 for p in (on, off))
        print(
            f"telemetry Envoy CPU ({side} sidecar): {e_on:.1f} us per request with telemetry"
            f" vs {e_off:.1f} us without = {e_on / e_off:.2f} (+{e_on - e_off:.1f} us)"
        )
    print(
        f"telemetry requests counted by the backend agent: {counted:.0f} "
        f"(>= {total + 2000}: rounds and warm-up), {named:.0f} of them with the client's "
        f"workload as source_workload (>= {total}); dropped (by Envoy's gRPC logger, or "
        f"records the agent could not read): {dropped['client']:.0f} client-side and "
        f"{dropped['backend']:.0f} backend-side"
    )
    growth = max(rss1[k] - rss0[k] for k in rss0)
    print(
        f"telemetry agent RSS after {args.paths_requests:,} requests over 5,000 paths: "
        + ", ".join(f"{k} {rss0[k]:.1f} -> {rss1[k]:.1f} MB" for k in rss0)
        + f"; series {series0:.0f} -> {series1:.0f} (target: unchanged, growth <= 20 MB)"
    )
    if on.metrics and named < total:
        raise SystemExit("telemetry: the backend did not name its caller")
    ok = ratio >= 0.85 and p99_ratio <= 1.3 and series1 == series0 and growth <= 20
    print(f"telemetry benchmark took {time.monotonic() - t0:.0f}s: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
