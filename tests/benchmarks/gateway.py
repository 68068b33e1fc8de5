"""Benchmark: requests through our gateway against the same Envoy binary with the same config,
static, HTTP and HTTPS.

Our side is a real router pod: `pilotfish-agent --proxy-type router` with its Envoy, configured
over xDS by an in-process control plane from an Istio Gateway (HTTP server and an HTTPS SIMPLE
server with a file certificate) and a VirtualService, standard metrics on as by default.

The floor is equivalent by construction: once our Envoy serves, its own config (admin
`/config_dump?include_eds`, secrets fetched in full from the agent's SDS socket) becomes a
static bootstrap (tests/benchmarks/envoy_static.py) for a second Envoy on another address.
Same listeners, filters, routes, clusters, endpoints, certificates, access loggers, node; the
only differences are xDS-delivered vs static, and the agent beside ours.

Both Envoys' access loggers point at the same receiver: the agent's metrics FIFO (HTTP
records) and ALS socket (TCP), so both feed the same aggregator (they take turns: rounds
alternate; a record a side flushes just after its round can interleave with the next side's
in the FIFO and be dropped as malformed, which costs the count below, not the figures).
That is the equivalent of the real thing, not an approximation: a static Envoy must log to
something, and a second receiver (another aggregator process) would be one more process
competing for the machine's two cores during the floor's rounds only, while a sink that does
not count would make the floor's logging cheaper than ours. With one receiver, per-request
work outside Envoy is the same code on the same process for both sides. Both Envoys run with
the agent's `--concurrency 2` and send to the same backend (a third Envoy answering every
request itself).

h2load drives each side in alternating rounds; figures are medians over rounds: throughput
ratio (target >= 0.95) and p99 latency ratio (target <= 1.1), ours / floor; and each Envoy's
CPU per request (user + system), which a busy machine disturbs far less than the rates.
Our Envoy's stats are read before and after the rounds: a config update, a cluster or
listener rebuilt, or an xDS/SDS connection opened again in between is printed (a difference
between the sides other than xDS delivery itself; all 0 is the expected line).

Two more sides are measured the same way, for information:
- a twin: a second static Envoy from the same dump; its ratio to the floor is the run's
  noise (on a busy shared machine that noise can exceed the targets' margins, and a figure is
  only as good as it);
- the minimal floor: a hand-written bootstrap with one route to one cluster and nothing else
  (no access log, no peer-metadata filters): what all the gateway's per-request features
  together cost.

First (before any process starts) the control plane's side, full against one route changed
(target incremental <= 1/20 of full): generating the router's config from 1,000 real
HTTPRoutes, the Gateway API translation included (tests/benchmarks/gateway_httproutes.py,
the issue's figure), and from 1,000 gateway-bound VirtualServices of the same shape
(tests/benchmarks/gateway_config.py); `--config-only` runs just that part.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.benchmarks import envoy_static, gateway_config, gateway_httproutes
from tests.benchmarks.procstat import cpu_seconds, envoy_pid
from tests.support.controlplane import eventually, running_control_plane
from tests.support.envoy import envoy_binary
from tests.support.mesh import mesh_agent
from tests.support.net import pod_ip
from tests.support.testca import TestCA

HOST = "bench.example.com"
HTTP_PORT, HTTPS_PORT, BACKEND_PORT = 8080, 8443, 8080
_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"  # noqa: E501
_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"


def mesh_yaml(backend_ip: str, cert: Path, key: Path) -> str:
    return textwrap.dedent(
        f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: bench, namespace: default}}
        spec:
          selector: {{app: bench}}
          ports: [{{name: http, port: 9080, targetPort: {BACKEND_PORT}}}]
        ---
        apiVersion: networking.istio.io/v1
        kind: WorkloadEntry
        metadata: {{name: bench-0, namespace: default}}
        spec: {{address: "{backend_ip}", labels: {{app: bench}}}}
        ---
        apiVersion: networking.istio.io/v1
        kind: Gateway
        metadata: {{name: bench, namespace: istio-system}}
        spec:
          selector: {{istio: ingressgateway}}
          servers:
          - port: {{number: {HTTP_PORT}, name: http, protocol: HTTP}}
            hosts: [{HOST}]
          - port: {{number: {HTTPS_PORT}, name: https, protocol: HTTPS}}
            hosts: [{HOST}]
            tls: {{mode: SIMPLE, serverCertificate: {cert}, privateKey: {key}}}
        ---
        apiVersion: networking.istio.io/v1
        kind: VirtualService
        metadata: {{name: bench, namespace: default}}
        spec:
          hosts: [{HOST}]
          gateways: [istio-system/bench]
          http: [{{route: [{{destination: {{host: bench}}}}]}}]
        """
    )


def _hcm(routes: list[dict[str, Any]], stat: str) -> dict[str, Any]:
    return {
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": _HCM,
            "stat_prefix": stat,
            "codec_type": "AUTO",
            "route_config": {
                "virtual_hosts": [{"name": "bench", "domains": ["*"], "routes": routes}]
            },
            "http_filters": [
                {"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}}
            ],
        },
    }


def _address(ip: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": ip, "port_value": port}}


def backend_bootstrap(ip: str) -> dict[str, Any]:
    """The backend: answers every request itself (fast, the same for both sides)."""
    route = {
        "match": {"prefix": "/"},
        "direct_response": {"status": 200, "body": {"inline_string": "ok"}},
    }
    return {
        "admin": {"address": _address(ip, 15000)},
        "static_resources": {
            "listeners": [
                {
                    "name": "backend",
                    "address": _address(ip, BACKEND_PORT),
                    "filter_chains": [{"filters": [_hcm([route], "backend")]}],
                }
            ]
        },
    }


def minimal_bootstrap(ip: str, backend_ip: str, cert: Path, key: Path) -> dict[str, Any]:
    """The minimal floor: what the gateway routes, written by hand, with none of its
    per-request extras."""
    route = {"match": {"prefix": "/"}, "route": {"cluster": "bench", "timeout": "0s"}}
    tls = {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": _TLS,
            "common_tls_context": {
                "alpn_protocols": ["h2", "http/1.1"],
                "tls_certificates": [
                    {
                        "certificate_chain": {"filename": str(cert)},
                        "private_key": {"filename": str(key)},
                    }
                ],
            },
        },
    }
    return {
        "admin": {"address": _address(ip, 15000)},
        "static_resources": {
            "listeners": [
                {
                    "name": "http",
                    "address": _address(ip, HTTP_PORT),
                    "filter_chains": [{"filters": [_hcm([route], "http")]}],
                },
                {
                    "name": "https",
                    "address": _address(ip, HTTPS_PORT),
                    "filter_chains": [
                        {"filters": [_hcm([route], "https")], "transport_socket": tls}
                    ],
                },
            ],
            "clusters": [
                {
                    "name": "bench",
                    "type": "STATIC",
                    "connect_timeout": "10s",
                    "load_assignment": {
                        "cluster_name": "bench",
                        "endpoints": [
                            {
                                "lb_endpoints": [
                                    {"endpoint": {"address": _address(backend_ip, BACKEND_PORT)}}
                                ]
                            }
                        ],
                    },
                }
            ],
        },
    }


def start_envoy(bootstrap: dict[str, Any], workdir: Path, name: str) -> subprocess.Popen[bytes]:
    path = workdir / f"{name}.json"
    path.write_text(json.dumps(bootstrap))
    log = (workdir / f"{name}.log").open("wb")
    return subprocess.Popen(
        [
            envoy_binary(),
            "-c",
            str(path),
            "--use-dynamic-base-id",
            "--concurrency",
            "2",
            "--log-level",
            "warning",
            # As the agent runs its Envoy: the metrics records reach the agent's FIFO (which
            # the static copies write to as well) within a second, not Envoy's default 10 s.
            "--file-flush-interval-msec",
            "1000",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


class RunFailed(Exception):
    pass


def measured(url: str, ip: str, port: int, requests: int, log: Path) -> tuple[float, float]:
    """One figure; a run with failed requests is repeated (twice at most) and said, never
    averaged in: a failure is a fact about the run, not a slow request."""
    for attempt in range(3):
        try:
            return h2load(url, ip, port, requests, log)
        except RunFailed as e:
            print(f"run failed (attempt {attempt + 1}): {str(e).splitlines()[0]}", flush=True)
    raise SystemExit(f"{url} at {ip}:{port}: three runs in a row had failed requests")


def h2load(url: str, ip: str, port: int, requests: int, log: Path) -> tuple[float, float]:
    """(requests per second, p99 seconds) of one h2load run against ip:port."""
    out = subprocess.run(
        [
            "h2load",
            "-n",
            str(requests),
            "-c",
            "8",
            "-m",
            "8",
            "-t",
            "1",
            f"--connect-to={ip}:{port}",
            f"--log-file={log}",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    if not re.search(rf"{requests} succeeded, 0 failed, 0 errored", out):
        raise RunFailed(f"h2load saw failures against {url} at {ip}:{port}:\n{out}")
    rps = float(re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out).group(1))  # type: ignore[union-attr]
    durations = sorted(int(line.split("\t")[2]) for line in log.read_text().splitlines() if line)
    return rps, durations[int(len(durations) * 0.99) - 1] / 1e6


async def ready(ip: str) -> bool:
    url = f"http://{ip}:{HTTP_PORT}/"
    proc = await asyncio.create_subprocess_exec(
        "curl",
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-H",
        f"Host: {HOST}",
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await proc.communicate()
    return out == b"200"


def agent_entries(ip: str) -> float:
    """`pilotfish_agent_metrics_entries_total` on the agent's merged metrics."""
    with urllib.request.urlopen(f"http://{ip}:15020/stats/prometheus", timeout=10) as r:
        text = r.read().decode()
    name = "pilotfish_agent_metrics_entries_total "
    return sum(float(line[len(name) :]) for line in text.splitlines() if line.startswith(name))


# What in our Envoy's stats says its config moved during the rounds: an xDS or SDS connection
# opened again (each re-fetches every resource), an update accepted, a cluster or listener
# rebuilt (which drains its connections). The floor has none of these, so any of them is a
# difference between the sides besides the one the benchmark is about.
_CHURN = {
    "xDS/SDS connections opened": re.compile(r"cluster\.(xds|sds)-grpc\.upstream_cx_total"),
    # CDS, LDS, RDS, SDS and each cluster's EDS.
    "updates accepted": re.compile(r"\.update_success$"),
    "clusters added, modified or updated": re.compile(
        r"cluster_manager\.cluster_(added|modified|updated)"
    ),
    "listeners added or modified": re.compile(
        r"listener_manager\.listener_(added|modified|in_place_updated)"
    ),
}


def config_churn(admin: str) -> dict[str, int]:
    """Counters of `_CHURN` in the Envoy at `admin` (host:port), summed by kind."""
    with urllib.request.urlopen(f"http://{admin}/stats", timeout=10) as r:
        lines = r.read().decode().splitlines()
    out = dict.fromkeys(_CHURN, 0)
    for line in lines:
        name, _, value = line.partition(": ")
        for kind, pattern in _CHURN.items():
            if value.isdigit() and pattern.search(name):
                out[kind] += int(value)
    return out


def _medians(runs: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    return (
        statistics.median(x[0] for x in runs),
        statistics.median(x[1] for x in runs),
        statistics.median(x[2] for x in runs),
    )


async def equivalent_floors(
    gateway_ip: str, sds: Path, ips: list[str], workdir: Path
) -> list[subprocess.Popen[bytes]]:
    """Static Envoys on `ips`, each with our gateway Envoy's own config (its config dump)."""
    dump = await asyncio.to_thread(envoy_static.config_dump, f"{gateway_ip}:15000")
    secrets = await envoy_static.fetch_secrets(sds, envoy_static.secret_names(dump))
    procs = []
    for n, ip in enumerate(ips):
        bootstrap = envoy_static.static_bootstrap(dump, secrets, gateway_ip, ip)
        procs.append(start_envoy(bootstrap, workdir, f"equivalent-{n}"))
    return procs


# Sides, in the order a round measures them (reversed every other round): ours, the
# equivalent static floor, its twin (noise), the hand-written minimal floor (information).
SIDES = ("ours", "floor", "twin", "minimal")


def report(
    scheme: str, results: dict[tuple[str, str], list[tuple[float, float, float]]]
) -> dict[str, float]:
    o_rps, o_p99, o_cpu = _medians(results[(scheme, "ours")])
    f_rps, f_p99, f_cpu = _medians(results[(scheme, "floor")])
    t_rps, t_p99, t_cpu = _medians(results[(scheme, "twin")])
    m_rps, m_p99, m_cpu = _medians(results[(scheme, "minimal")])
    print(
        f"gateway {scheme}: {o_rps:.0f} req/s vs the same config static {f_rps:.0f} req/s,"
        f" ratio {o_rps / f_rps:.2f} (target >= 0.95); p99 {o_p99 * 1000:.2f} ms vs"
        f" {f_p99 * 1000:.2f} ms, ratio {o_p99 / f_p99:.2f} (target <= 1.1);"
        f" noise (identical static twin / floor): {t_rps / f_rps:.2f}, p99 {t_p99 / f_p99:.2f}"
    )
    # CPU per request is what a busy machine disturbs least: read it beside the rates.
    print(
        f"gateway {scheme} Envoy CPU per request: ours {o_cpu * 1e6:.1f} us, floor"
        f" {f_cpu * 1e6:.1f} us (ratio {o_cpu / f_cpu:.2f}), twin {t_cpu * 1e6:.1f} us"
        f" ({t_cpu / f_cpu:.2f}), minimal {m_cpu * 1e6:.1f} us"
    )
    print(
        f"gateway {scheme} (information): vs a minimal hand-written static Envoy"
        f" {m_rps:.0f} req/s, ratio {o_rps / m_rps:.2f}; p99 {m_p99 * 1000:.2f} ms,"
        f" ratio {o_p99 / m_p99:.2f}; the equivalent config's own cost: {f_rps / m_rps:.2f},"
        f" p99 {f_p99 / m_p99:.2f}"
    )
    return {
        f"{scheme}_throughput_ratio": o_rps / f_rps,
        f"{scheme}_p99_ratio": o_p99 / f_p99,
        f"{scheme}_cpu_ratio": o_cpu / f_cpu,
        f"{scheme}_noise_throughput_ratio": t_rps / f_rps,
        f"{scheme}_noise_p99_ratio": t_p99 / f_p99,
        f"{scheme}_noise_cpu_ratio": t_cpu / f_cpu,
        f"{scheme}_minimal_throughput_ratio": o_rps / m_rps,
        f"{scheme}_minimal_p99_ratio": o_p99 / m_p99,
        f"{scheme}_minimal_cpu_ratio": o_cpu / m_cpu,
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--requests", type=int, default=40000)
    ap.add_argument("--routes", type=int, default=1000, help="config part: HTTPRoutes")
    ap.add_argument("--destination-rules", type=int, default=100, help="config part")
    ap.add_argument("--config-runs", type=int, default=7)
    ap.add_argument("--config-only", action="store_true", help="only the config generation part")
    args = ap.parse_args()
    config = gateway_config.run(args.routes, args.destination_rules, args.config_runs)
    config.update(gateway_httproutes.run(args.routes, args.config_runs))
    if args.config_only:
        print(json.dumps(config))
        return
    tmp = Path(tempfile.mkdtemp(prefix="pf-gateway-"))
    issued = TestCA().server_cert([HOST])
    cert, key = issued.write(tmp, "bench")
    backend_ip, gateway_ip, floor_ip, twin_ip, minimal_ip = (pod_ip() for _ in range(5))
    ips = {"ours": gateway_ip, "floor": floor_ip, "twin": twin_ip, "minimal": minimal_ip}
    cfg = tmp / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(mesh_yaml(backend_ip, cert, key))
    procs = [
        start_envoy(backend_bootstrap(backend_ip), tmp, "backend"),
        start_envoy(minimal_bootstrap(minimal_ip, backend_ip, cert, key), tmp, "minimal"),
    ]
    agent = None
    try:
        async with running_control_plane(cfg) as cp:
            agent = mesh_agent(
                cp,
                tmp,
                gateway_ip,
                "ingress-0",
                "istio=ingressgateway",
                "--proxy-type",
                "router",
                namespace="istio-system",
                service_account="ingress",
            )
            agent.start()
            await eventually(lambda: ready(gateway_ip), timeout=60, what="gateway answering")
            procs += await equivalent_floors(
                gateway_ip, tmp / "ingress-0" / "SDS", [floor_ip, twin_ip], tmp
            )
            for side, ip in ips.items():
                await eventually(
                    lambda ip=ip: ready(ip),  # type: ignore[misc]
                    timeout=60,
                    what=f"{side} answering",
                )
            pids = {
                "ours": envoy_pid(agent.proc.pid),  # type: ignore[union-attr]
                "floor": procs[2].pid,
                "twin": procs[3].pid,
                "minimal": procs[1].pid,
            }
            results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
            churn_before = await asyncio.to_thread(config_churn, f"{gateway_ip}:15000")
            for r in range(args.rounds):
                for scheme, port in (("http", HTTP_PORT), ("https", HTTPS_PORT)):
                    url = f"{scheme}://{HOST}:{port}/"
                    # Alternate who goes first: neither side always gets the warmer machine.
                    for side in SIDES if r % 2 == 0 else reversed(SIDES):
                        log = tmp / f"{scheme}-{side}-{r}.tsv"
                        before = cpu_seconds(pids[side])
                        rps, p99 = measured(url, ips[side], port, args.requests, log)
                        cpu = (cpu_seconds(pids[side]) - before) / args.requests
                        results.setdefault((scheme, side), []).append((rps, p99, cpu))
            churn_after = await asyncio.to_thread(config_churn, f"{gateway_ip}:15000")
            summary: dict[str, float] = dict(config)
            for scheme in ("http", "https"):
                summary.update(report(scheme, results))
            churn = {kind: churn_after[kind] - churn_before[kind] for kind in _CHURN}
            print(
                "gateway ours' Envoy during the rounds (all 0 when its config stood still): "
                + ", ".join(f"{kind} {n}" for kind, n in churn.items())
            )
            summary["ours_config_churn"] = sum(churn.values())
            # The last batches reach the agent within the loggers' flush interval.
            await asyncio.sleep(2)
            counted = await asyncio.to_thread(agent_entries, gateway_ip)
            logged = args.rounds * 2 * 3 * args.requests
            print(
                f"gateway access log entries counted by the agent: {counted:.0f}"
                f" (>= {logged}: every request to ours, the floor and the twin)"
            )
            summary["agent_entries_counted"] = counted
            print(json.dumps(summary))
    finally:
        if agent is not None:
            agent.kill()
        for p in procs:
            p.kill()
            p.wait()
        # Keys, sockets and logs of this run (h2load's logs alone are ~20 MB).
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
