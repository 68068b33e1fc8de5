"""xDS load tool: N simulated Envoys on real gRPC streams against a control plane on loopback.

Each simulated proxy has a node identity of its own (`sidecar~<ip>~load-<i>.<ns>~<ns>.svc.
cluster.local`, node metadata as the agent sends it, AUTO_REGISTER=false) and subscribes like
Envoy over ADS, SotW or delta: CDS and LDS wildcard, EDS and RDS by name, ACKing everything
(the rules are in xds_sim.py, sans-IO). The proxies are spread over worker processes, so that
the clients are not the bottleneck on a small machine, and over gRPC channels: `--per-channel`
streams (100 by default) share one HTTP/2 connection. Real sidecars have a connection each;
sharing keeps the clients cheap, and the server's cost per stream then includes a hundredth
of a connection. A stream that fails is counted and re-opened after a second, like Envoy's.

Workers report JSON lines on stdout; the parent (`LoadClients`, also used by the benchmarks)
aggregates them. Run it by hand against a running control plane:

    python tests/benchmarks/xds_load.py --target 127.0.0.1:15010 --proxies 200 [--delta]

It waits until every proxy has converged, keeps the streams open for `--hold` seconds
(pushes during that time are ACKed and counted), and prints one line per figure. Bounded: at
most 20,000 proxies, 8 worker processes and --timeout seconds (workers also exit on their own
then, or when the parent closes their stdin); loopback targets only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import math
import random
import resource
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pilotfish_common.lifecycle import Lifecycle
from tests.benchmarks.xds_sim import (
    Decoder,
    Encoder,
    SimulatedProxy,
    proxy_identity,
)

SOTW_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
DELTA_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
MAX_PROXIES = 20_000
MAX_WORKERS = 8
STATUS_INTERVAL = 0.25
RECONNECT_DELAY = 1.0


def check_loopback(target: str) -> str:
    """The load tool only talks to this machine: HOST:PORT with a loopback HOST."""
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{target!r} is not HOST:PORT")
    host = host.strip("[]")
    if host != "localhost":
        try:
            if not ipaddress.ip_address(host).is_loopback:
                raise ValueError(f"{target!r} is not a loopback address")
        except ValueError as e:
            raise ValueError(f"{target!r}: the load tool only targets loopback ({e})") from None
    return target


# --- worker process ------------------------------------------------------------------------


def _identity(b: bytes) -> bytes:
    return b


@dataclass(slots=True)
class _Runner:
    """One simulated proxy's stream, reconnected when it fails."""

    index: int
    sim: SimulatedProxy
    encoder: Encoder
    connected_at: float = 0.0
    streams: int = 0
    errors: list[str] | None = None
    call: Any = None  # the stream now open
    recycling: bool = False  # closed on purpose (connection churn): not an error

    def error(self, what: str) -> None:
        if self.errors is None:
            self.errors = []
        self.errors.append(what)


class Worker:
    """Runs `count` simulated proxies from index `first` in this process."""

    def __init__(self, args: argparse.Namespace) -> None:
        import grpc

        self.grpc = grpc
        self.args = args
        self.decoder = Decoder()
        names_cache: dict[tuple[str, ...], bytes] = {}
        self.runners = [
            _Runner(
                i,
                SimulatedProxy(
                    proxy_identity(i, args.namespace), delta=args.delta, lds=not args.no_lds
                ),
                Encoder(proxy_identity(i, args.namespace), names_cache),
            )
            for i in range(args.first, args.first + args.count)
        ]
        options = [
            ("grpc.max_receive_message_length", 256 << 20),
            ("grpc.use_local_subchannel_pool", 1),  # one connection per channel, not shared
        ]
        n_channels = max(1, math.ceil(args.count / args.per_channel))
        self.channels = [
            grpc.aio.insecure_channel(args.target, options=options) for _ in range(n_channels)
        ]
        self.stopping = asyncio.Event()
        self.connected = 0
        self.failures = 0
        self.recycled = 0

    def _channel(self, runner: _Runner) -> Any:
        return self.channels[(runner.index - self.args.first) // self.args.per_channel]

    async def run_proxy(self, runner: _Runner) -> None:
        grpc = self.grpc
        delta = self.args.delta
        decode = self.decoder.delta if delta else self.decoder.sotw
        encode = runner.encoder.delta if delta else runner.encoder.sotw
        method = DELTA_METHOD if delta else SOTW_METHOD
        sim = runner.sim
        while not self.stopping.is_set():
            call = self._channel(runner).stream_stream(
                method, request_serializer=_identity, response_deserializer=_identity
            )()
            runner.streams += 1
            runner.call = call
            live = False
            t_open = time.monotonic()
            n_resp = 0
            try:
                for req in sim.start():
                    await call.write(encode(req))
                runner.connected_at = runner.connected_at or time.monotonic()
                self.connected += 1
                live = True
                while True:
                    raw = await call.read()
                    if raw is grpc.aio.EOF:
                        runner.error("EOF")
                        break
                    n_resp += 1
                    for req in sim.on_response(decode(raw), time.monotonic()):
                        await call.write(encode(req))
            except grpc.aio.AioRpcError as e:
                if not self.stopping.is_set() and not runner.recycling:
                    runner.error(
                        f"{e.code().name}: {e.details()} "
                        f"({time.monotonic() - t_open:.1f} s into the stream, {n_resp} responses)"
                    )
            except (grpc.aio.UsageError, asyncio.InvalidStateError) as e:
                if not self.stopping.is_set() and not runner.recycling:
                    runner.error(type(e).__name__)
            except asyncio.CancelledError:
                # grpc.aio raises this in a read of a call we cancelled (recycle); anything
                # else is this task being cancelled.
                if not runner.recycling or self.stopping.is_set():
                    raise
            finally:
                if live:
                    self.connected -= 1
                call.cancel()
                runner.call = None
            if self.stopping.is_set():
                return
            sim.converged = False
            if runner.recycling:
                runner.recycling = False
                self.recycled += 1
                continue  # a proxy that restarted dials again at once
            self.failures += 1
            # A new stream starts from scratch (Envoy re-requests everything too).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self.stopping.wait(), RECONNECT_DELAY * (0.5 + random.random())
                )

    def recycle(self, n: int) -> None:
        """Close n random open streams, as proxies that restart do; they dial again."""
        open_now = [r for r in self.runners if r.call is not None and not r.recycling]
        for r in random.sample(open_now, min(n, len(open_now))):
            r.recycling = True
            r.call.cancel()

    def status(self) -> dict[str, Any]:
        converged = [r.sim.converged_at for r in self.runners if r.sim.converged_at is not None]
        responses: dict[str, int] = {}
        acks: dict[str, int] = {}
        for r in self.runners:
            for k, v in r.sim.counters.responses.items():
                responses[k] = responses.get(k, 0) + v
            for k, v in r.sim.counters.acks.items():
                acks[k] = acks.get(k, 0) + v
        return {
            "event": "status",
            "t": time.monotonic(),
            "proxies": len(self.runners),
            "connected": self.connected,
            "converged_once": len(converged),
            "converged_now": sum(1 for r in self.runners if r.sim.converged),
            "last_converged": max(converged, default=None),
            "failures": self.failures,
            "recycled": self.recycled,
            "responses": responses,
            "acks": acks,
            "marker_min": min((r.sim.marker for r in self.runners), default=0),
            "cpu": time.process_time(),
            "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "full_decodes": self.decoder.full_decodes,
        }

    def report(self) -> dict[str, Any]:
        return {
            "event": "report",
            "proxies": [
                {
                    "i": r.index,
                    "connected_at": r.connected_at,
                    "converged_at": r.sim.converged_at,
                    "converged": r.sim.converged,
                    "streams": r.streams,
                    "errors": r.errors or [],
                    "responses": r.sim.counters.responses,
                    "acks": r.sim.counters.acks,
                    "markers": r.sim.markers,
                }
                for r in self.runners
            ],
        }

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        tasks = [asyncio.create_task(self.run_proxy(r)) for r in self.runners]
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

        async def report_status() -> None:
            while True:
                _emit(self.status())
                await asyncio.sleep(STATUS_INTERVAL)

        reporter = asyncio.create_task(report_status())
        deadline = loop.time() + self.args.timeout
        try:
            while True:
                try:
                    line = await asyncio.wait_for(reader.readline(), deadline - loop.time())
                except TimeoutError:
                    break  # bounded in time even if the parent is gone
                cmd = line.decode().strip()
                if cmd == "report":
                    _emit(self.status())
                    _emit(self.report())
                elif cmd.startswith("recycle "):
                    self.recycle(int(cmd.split()[1]))
                elif cmd == "forget":
                    # Start a new measurement: markers recorded so far are dropped.
                    for r in self.runners:
                        r.sim.markers.clear()
                elif cmd in ("stop", ""):
                    break
        finally:
            self.stopping.set()
            reporter.cancel()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, reporter, return_exceptions=True)
            for ch in self.channels:
                await ch.close()
            _emit(self.status())


async def _worker(args: argparse.Namespace) -> None:
    # Inside the loop: grpc.aio channels belong to the loop they are created in.
    await Worker(args).run()


def _emit(obj: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


# --- parent side ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadOptions:
    target: str
    proxies: int
    workers: int = 0  # 0: one per 1,250 proxies, 1 to 4
    delta: bool = False
    per_channel: int = 100
    namespace: str = "default"
    first_index: int = 0
    lds: bool = True
    timeout: float = 3600.0  # workers exit after this long whatever happens


class LoadClients(Lifecycle):
    """Simulated proxies in worker processes; `async with LoadClients(opts) as load:`."""

    def __init__(self, opts: LoadOptions) -> None:
        check_loopback(opts.target)
        if not 1 <= opts.proxies <= MAX_PROXIES:
            raise ValueError(f"--proxies must be 1..{MAX_PROXIES}")
        self.opts = opts
        n = opts.workers or min(4, max(1, math.ceil(opts.proxies / 1250)))
        self.n_workers = min(n, MAX_WORKERS, opts.proxies)
        self.procs: list[asyncio.subprocess.Process] = []
        self.statuses: dict[int, dict[str, Any]] = {}
        self._reports: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._readers: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()
        self.started_at = 0.0

    async def start(self) -> None:
        o = self.opts
        per = math.ceil(o.proxies / self.n_workers)
        self.started_at = time.monotonic()
        for w in range(self.n_workers):
            first = o.first_index + w * per
            count = min(per, o.first_index + o.proxies - first)
            if count <= 0:
                break
            args = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--worker",
                "--target",
                o.target,
                "--first",
                str(first),
                "--count",
                str(count),
                "--per-channel",
                str(o.per_channel),
                "--namespace",
                o.namespace,
                "--timeout",
                str(o.timeout),
            ]
            if o.delta:
                args.append("--delta")
            if not o.lds:
                args.append("--no-lds")
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=256 << 20,  # a report of thousands of proxies is one line
            )
            self.procs.append(proc)
            self._readers.append(asyncio.create_task(self._read(w, proc)))

    async def _read(self, w: int, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            msg = json.loads(line)
            if msg["event"] == "status":
                self.statuses[w] = msg
                self._changed.set()
            elif msg["event"] == "report":
                fut = self._reports.get(w)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        fut = self._reports.get(w)
        if fut is not None and not fut.done():
            fut.set_exception(RuntimeError(f"load worker {w} exited ({proc.returncode})"))
        self._changed.set()

    def _alive(self) -> bool:
        return all(p.returncode is None for p in self.procs)

    def status(self) -> dict[str, Any]:
        """Sum over the workers' latest status lines."""
        out: dict[str, Any] = {
            "proxies": 0,
            "connected": 0,
            "converged_once": 0,
            "converged_now": 0,
            "failures": 0,
            "recycled": 0,
            "cpu": 0.0,
            "responses": {},
            "acks": {},
            "last_converged": None,
            "marker_min": None,
            "workers_rss_kb": 0,
        }
        for s in self.statuses.values():
            for k in (
                "proxies",
                "connected",
                "converged_once",
                "converged_now",
                "failures",
                "recycled",
            ):
                out[k] += s[k]
            out["cpu"] += s["cpu"]
            out["workers_rss_kb"] += s["maxrss_kb"]
            for kind in ("responses", "acks"):
                for t, v in s[kind].items():
                    out[kind][t] = out[kind].get(t, 0) + v
            if s["last_converged"] is not None:
                out["last_converged"] = max(out["last_converged"] or 0.0, s["last_converged"])
            m = s["marker_min"]
            out["marker_min"] = m if out["marker_min"] is None else min(out["marker_min"], m)
        return out

    async def wait_for(self, predicate: Any, timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            s = self.status()
            if len(self.statuses) == len(self.procs) and predicate(s):
                return s
            if not self._alive():
                raise RuntimeError(f"a load worker exited while waiting for {what}: {s}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"timed out waiting for {what}: {s}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 1.0))

    async def wait_converged(self, timeout: float) -> dict[str, Any]:
        """Until every proxy holds ACKed config for everything it learned."""
        n = self.opts.proxies
        return await self.wait_for(lambda s: s["converged_now"] == n, timeout, "convergence")

    async def _command(self, cmd: str) -> None:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(cmd.encode() + b"\n")
            await p.stdin.drain()

    async def forget_markers(self) -> None:
        await self._command("forget")

    async def recycle(self, per_worker: int) -> None:
        """Close that many random streams in every worker; the proxies dial again at once."""
        await self._command(f"recycle {per_worker}")

    async def report(self, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Per-proxy records (see Worker.report) from every worker."""
        loop = asyncio.get_running_loop()
        self._reports = {w: loop.create_future() for w in range(len(self.procs))}
        await self._command("report")
        results = await asyncio.wait_for(asyncio.gather(*self._reports.values()), timeout)
        return [p for r in results for p in r["proxies"]]

    async def close(self) -> None:
        for p in self.procs:
            if p.returncode is None and p.stdin is not None:
                with contextlib.suppress(ConnectionError):
                    p.stdin.write(b"stop\n")
                    await p.stdin.drain()
                    p.stdin.close()
        for p in self.procs:
            try:
                await asyncio.wait_for(p.wait(), 15)
            except TimeoutError:
                p.kill()
                await p.wait()
        for t in self._readers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(t, 5)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return s[k]


def check_acks(records: list[dict[str, Any]]) -> list[str]:
    """Problems with a run's records: a proxy that saw a stream error, or whose ACK count
    differs from its response count for some type (every response must be ACKed once)."""
    problems = []
    for r in records:
        if r["errors"]:
            problems.append(f"proxy {r['i']}: stream errors {r['errors']}")
        if r["responses"] != r["acks"]:
            problems.append(f"proxy {r['i']}: responses {r['responses']} != acks {r['acks']}")
    return problems


# --- command line --------------------------------------------------------------------------


async def _cli(args: argparse.Namespace) -> int:
    opts = LoadOptions(
        target=args.target,
        proxies=args.proxies,
        workers=args.workers,
        delta=args.delta,
        per_channel=args.per_channel,
        namespace=args.namespace,
        lds=not args.no_lds,
        timeout=args.timeout + 30,
    )
    async with LoadClients(opts) as load:
        t0 = load.started_at
        try:
            await load.wait_converged(args.timeout)
        except (TimeoutError, RuntimeError) as e:
            print(f"xds_load: {e}", file=sys.stderr)
            return 1
        if args.hold > 0:
            await asyncio.sleep(args.hold)
        records = await load.report()
        status = load.status()
    times = [r["converged_at"] - t0 for r in records if r["converged_at"] is not None]
    mode = "delta" if args.delta else "sotw"
    print(f"xds_load: {args.proxies} proxies ({mode}) on {load.n_workers} worker(s)")
    print(
        f"time to converge from start: p50 {statistics.median(times):.2f} s  "
        f"p99 {percentile(times, 99):.2f} s  all {max(times):.2f} s"
    )
    print(f"responses: {status['responses']}  acks: {status['acks']}")
    print(f"stream failures: {status['failures']}  client CPU: {status['cpu']:.1f} s")
    problems = check_acks(records)
    for p in problems[:10]:
        print(f"problem: {p}")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="127.0.0.1:15010", help="control plane xDS HOST:PORT")
    ap.add_argument(
        "--proxies", type=int, default=100, help=f"simulated proxies (<= {MAX_PROXIES})"
    )
    ap.add_argument("--workers", type=int, default=0, help="worker processes (0: by size)")
    ap.add_argument("--delta", action="store_true", help="delta xDS instead of SotW")
    ap.add_argument("--per-channel", type=int, default=100, help="streams per gRPC channel")
    ap.add_argument("--namespace", default="default", help="namespace of the simulated pods")
    ap.add_argument("--no-lds", action="store_true", help="subscribe to CDS and EDS only")
    ap.add_argument("--hold", type=float, default=0.0, help="seconds to stay after converging")
    ap.add_argument("--timeout", type=float, default=300.0, help="give up after this long")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        check_loopback(args.target)
    except ValueError as e:
        ap.error(str(e))
    import uvloop

    if args.worker:
        uvloop.run(_worker(args))
        return
    if not 1 <= args.proxies <= MAX_PROXIES:
        ap.error(f"--proxies must be 1..{MAX_PROXIES}")
    if not 0 <= args.workers <= MAX_WORKERS:
        ap.error(f"--workers must be 0..{MAX_WORKERS}")
    if args.per_channel < 1:
        ap.error("--per-channel must be at least 1")
    sys.exit(uvloop.run(_cli(args)))


if __name__ == "__main__":
    main()
