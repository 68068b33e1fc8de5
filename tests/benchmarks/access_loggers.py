"""Benchmark: what each way of getting per-request records out of Envoy costs Envoy, in CPU
per request, HTTP and HTTPS.

Static Envoys (no xDS, no agent), one per variant, each proxying h2load's requests to the same
backend Envoy (a direct response), identical but for the access logger on their HCMs:

- `none`: no logger (the floor);
- `grpc`: Envoy's `http_grpc` logger configured as the standard metrics' used to be (literal
  custom tags naming the workload, content-type and grpc-status headers, 1 MB buffer, 1 s
  flush) to a real AccessLogService: the agent's own `AccessLogServer` and aggregator;
- `fifo`: Envoy's file logger with a compact text format (the fields the standard metrics
  read, separated by 0x1f) written to a FIFO that the agent's reader drains and counts
  (agent/telemetry/fifo.py) — how the standard metrics are read now;
- `fluentd`: Envoy's fluentd logger (msgpack over TCP) with the same fields, to a sink that
  only drains the socket (so its figure is Envoy's cost alone, receiver not counted);
- `text`: Envoy's file logger with Istio's default TEXT format to a file (a user's access log);
- `client`, `server`: what the control plane gives a sidecar's outbound (client) and inbound
  (server) HCMs for the standard metrics on the records path, filters and logger, from
  `instrument_listener` itself. The server's peer-metadata read and answer apply on its mTLS
  chain only, so read its `https` line (h2load sends no peer header: the read finds none).
  With `--baseline ROOT` the same two come also from the checkout at ROOT, as `client@base`
  and `server@base`, in the same rounds: a change's cost or saving against the same floor.
  `client+text` and `server+text` add the `text` logger (a sidecar with access logs on); a
  `~KB` suffix (`client+text~1024`) runs that variant's Envoy with another
  `--file-flush-min-size-kb`.

The receivers run in one child process (`--sink`), so their CPU is measured apart from this
driver's: per variant, the receiver CPU per request is the child's CPU during that variant's
rounds. Rounds alternate the variants (the order reversed every other round); each figure is
the median over rounds. Envoy CPU per request is user + system time from /proc/<pid>/stat
over the round, divided by the requests: a busy machine disturbs it far less than a rate.
Every line prints the same-run floor (`none`) and the ratio. The HTTPS listener presents a
SPIFFE certificate, as a sidecar's inbound does (h2load sends none, so the peer SAN is empty).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.benchmarks.gateway import _address, backend_bootstrap, h2load
from tests.benchmarks.logger_configs import SIDES, TAGS, instrumented, logger
from tests.benchmarks.procstat import cpu_seconds, load_average
from tests.support.envoy import envoy_binary
from tests.support.net import free_port, pod_ip
from tests.support.testca import TestCA

HOST = "bench.example.com"
HTTP_PORT, HTTPS_PORT, BACKEND_PORT = 8080, 8443, 8080
VARIANTS = ("none", "grpc", "fifo", "fluentd", "text", "client", "server")
# A side with a user's access log too (Istio's TEXT format to a file): `client+text`.
WITH_TEXT = "+text"
# A variant run with another --file-flush-min-size-kb: `client+text~1024`.
FLUSH = "~"
_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"  # noqa: E501
_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"


def proxy_bootstrap(
    ip: str, backend_ip: str, cert: Path, key: Path, logs: list[Any], extra: list[Any]
) -> dict[str, Any]:
    def hcm(stat: str) -> dict[str, Any]:
        route = {"match": {"prefix": "/"}, "route": {"cluster": "backend", "timeout": "0s"}}
        return {
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": _HCM,
                "stat_prefix": stat,
                "codec_type": "AUTO",
                "route_config": {
                    "virtual_hosts": [{"name": "b", "domains": ["*"], "routes": [route]}]
                },
                "http_filters": [
                    {"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}}
                ],
                "access_log": logs,
            },
        }

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
    backend = {
        "name": "backend",
        "type": "STATIC",
        "connect_timeout": "10s",
        "load_assignment": {
            "cluster_name": "backend",
            "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": _address(backend_ip, BACKEND_PORT)}}]}
            ],
        },
    }
    return {
        "admin": {"address": _address(ip, 15000)},
        "static_resources": {
            "listeners": [
                {
                    "name": "http",
                    "address": _address(ip, HTTP_PORT),
                    "filter_chains": [{"filters": [hcm("http")]}],
                },
                {
                    "name": "https",
                    "address": _address(ip, HTTPS_PORT),
                    "filter_chains": [{"filters": [hcm("https")], "transport_socket": tls}],
                },
            ],
            "clusters": [backend, *extra],
        },
    }


def start_envoy(
    bootstrap: dict[str, Any], workdir: Path, name: str, flush_min_kb: int = 0
) -> subprocess.Popen[bytes]:
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
            # The agent's Envoy flushes file logs this often (Envoy's default is 10 s).
            "--file-flush-interval-msec",
            "1000",
            *(["--file-flush-min-size-kb", str(flush_min_kb)] if flush_min_kb else []),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


# --- the receivers (child process) ----------------------------------------------------------


async def sink(workdir: Path, fluentd_ip: str, fluentd_port: int) -> None:
    """The agent's ALS server and FIFO reader, and a draining fluentd socket, until stdin
    closes; then prints what each received as JSON."""
    from agent.telemetry.aggregator import MetricsAggregator
    from agent.telemetry.als import AccessLogServer
    from agent.telemetry.fifo import MetricsFifo
    from agent.telemetry.records import RecordFeed

    aggregator = MetricsAggregator()
    als = AccessLogServer(workdir / "ALS", aggregator)
    await als.start()
    fifo = MetricsFifo(workdir / "METRICS")
    feed = RecordFeed(aggregator)
    fifo.start(feed)
    received = {"fluentd_bytes": 0}
    writers: set[asyncio.StreamWriter] = set()

    async def drain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.add(writer)
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(1 << 16):
                received["fluentd_bytes"] += len(chunk)
        writer.close()

    server = await asyncio.start_server(drain, fluentd_ip, fluentd_port)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    server.close()
    for w in writers:  # their readers see the end, and the drains return
        w.close()
    await asyncio.sleep(0.1)
    await fifo.close()
    await als.close()
    print(
        json.dumps(
            {
                "entries": aggregator.entries,
                "fifo_lines": feed.decoder.lines,
                "fifo_dropped": aggregator.records_dropped,
                **received,
            }
        ),
        flush=True,
    )


# --- the driver -----------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=20000, help="per round, variant and scheme")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--no-https", action="store_true")
    ap.add_argument(
        "--flush-min-kb",
        type=int,
        default=0,
        help="Envoy's --file-flush-min-size-kb (0: its default)",
    )
    ap.add_argument("--baseline", type=Path, help="a checkout to compare client and server with")
    ap.add_argument("--sink", nargs=3, metavar=("WORKDIR", "IP", "PORT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sink:
        import uvloop

        uvloop.run(sink(Path(args.sink[0]), args.sink[1], int(args.sink[2])))
        return 0
    variants = [v for v in args.variants.split(",") if v]
    bases = {v.partition(FLUSH)[0].removesuffix(WITH_TEXT) for v in variants}
    if "none" not in variants or not bases <= set(VARIANTS):
        raise SystemExit(
            f"--variants: a subset of {','.join(VARIANTS)} that holds none (client and server"
            f" also as client{WITH_TEXT} and server{WITH_TEXT}; any with ~KB, its flush size)"
        )
    if args.baseline is not None:
        if not (args.baseline / "control/generate/telemetry_metrics.py").is_file():
            raise SystemExit(f"--baseline: no Pilotfish checkout at {args.baseline}")
        variants += [f"{v}@base" for v in variants if v.removesuffix(WITH_TEXT) in SIDES]
    schemes = [("http", HTTP_PORT)] + ([] if args.no_https else [("https", HTTPS_PORT)])
    tmp = Path(tempfile.mkdtemp(prefix="pf-loggers-"))
    # A sidecar's kind of certificate (a SPIFFE URI SAN): Envoy caches a connection's SANs
    # only when there are some, so a DNS-only certificate would make %DOWNSTREAM_LOCAL_URI_SAN%
    # look far dearer than it is in the mesh.
    issued = TestCA().client_cert(TAGS["principal"])
    cert, key = issued.write(tmp, "bench")
    backend_ip = pod_ip()
    ips = {v: pod_ip() for v in variants}
    fluentd = (backend_ip, free_port(backend_ip))
    procs: list[subprocess.Popen[bytes]] = []
    receiver = subprocess.Popen(
        [sys.executable, __file__, "--sink", str(tmp), *map(str, fluentd)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert receiver.stdout is not None and receiver.stdin is not None
        if receiver.stdout.readline().strip() != "ready":
            raise SystemExit("receiver did not start")
        procs.append(start_envoy(backend_bootstrap(backend_ip), tmp, "backend"))
        for v in variants:
            side, _, base = v.partition("@")
            side, _, flush_kb = side.partition(FLUSH)
            text = side.endswith(WITH_TEXT)
            side = side.removesuffix(WITH_TEXT)
            logs, extra = logger("text" if text else "none" if side in SIDES else v, tmp, fluentd)
            bootstrap = proxy_bootstrap(ips[v], backend_ip, cert, key, logs, extra)
            if side in SIDES:
                root = args.baseline if base else ROOT
                bootstrap = instrumented(bootstrap, side, tmp / "METRICS", root)
            procs.append(start_envoy(bootstrap, tmp, v, int(flush_kb or args.flush_min_kb)))
        pids = {v: p.pid for v, p in zip(variants, procs[1:], strict=True)}
        _wait_ready([*ips.values()], tmp)
        # Warm-up: connections to the backend and the receivers, first allocations.
        for v in variants:
            for scheme, port in schemes:
                h2load(f"{scheme}://{HOST}:{port}/", ips[v], port, 2000, tmp / "warm.tsv")
        envoy_cpu: dict[tuple[str, str], list[float]] = {}
        sink_cpu: dict[tuple[str, str], list[float]] = {}
        loads = [load_average()]
        for r in range(args.rounds):
            for v in variants if r % 2 == 0 else reversed(variants):
                for scheme, port in schemes:
                    e0, s0 = cpu_seconds(pids[v]), cpu_seconds(receiver.pid)
                    h2load(f"{scheme}://{HOST}:{port}/", ips[v], port, args.requests, tmp / "r.tsv")
                    # The receivers' share arrives within the loggers' 1 s flush.
                    time.sleep(1.2)
                    n = args.requests
                    envoy_cpu.setdefault((v, scheme), []).append((cpu_seconds(pids[v]) - e0) / n)
                    sink_cpu.setdefault((v, scheme), []).append(
                        (cpu_seconds(receiver.pid) - s0) / n
                    )
            loads.append(load_average())
        receiver.stdin.close()
        received = json.loads(receiver.stdout.readline())
        print(f"load average (1/5/15 min) before and after each round: {' | '.join(loads)}")
        for scheme, _ in schemes:
            floor = statistics.median(envoy_cpu[("none", scheme)]) * 1e6
            for v in variants:
                e = statistics.median(envoy_cpu[(v, scheme)]) * 1e6
                s = statistics.median(sink_cpu[(v, scheme)]) * 1e6
                print(
                    f"access logger {v} {scheme}: Envoy CPU {e:.1f} us/request vs {floor:.1f}"
                    f" without a logger, ratio {e / floor:.2f} (logger +{e - floor:.1f} us);"
                    f" receiver CPU {s:.1f} us/request"
                )
        print(f"receivers: {json.dumps(received)}")
        return 0
    finally:
        with contextlib.suppress(OSError):
            if receiver.stdin is not None:
                receiver.stdin.close()
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        receiver.kill()
        receiver.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _wait_ready(ips: list[str], tmp: Path) -> None:
    deadline = time.monotonic() + 30
    for ip in ips:
        while True:
            try:
                with socket.create_connection((ip, HTTP_PORT), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"Envoy at {ip} not listening; see {tmp}") from None
                time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
