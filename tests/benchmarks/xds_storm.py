"""Benchmark: a connection storm. N simulated proxies (xds_load.py) connect at once to a
control plane serving S services x E endpoints, and subscribe like Envoy (CDS, EDS, LDS, RDS).

Ours: `python -m control` with its defaults (adaptive admission, control/xds/admission.py: it
starts at 200 new streams/s after a burst of 400 and goes as fast as the control plane keeps
up, to at most 2,000/s; `pilotfish_xds_connections_rate_limited_total` counts the streams that
waited, `pilotfish_xds_admission_rate` is the rate, sampled every second of the storm and
printed). Floor, same run: a bare grpc.aio server in its own process serving
the same pre-serialized bytes with no admission control (xds_floor.py). Both are measured the
same way:

- time to full convergence: from the first stream opened to the last proxy holding ACKed
  CDS, EDS, LDS and RDS for everything it learned (target: ours <= 1.5x the floor's);
- errors: streams that failed (client side), and the control plane's stream/push errors
  (target: zero);
- peak RSS during the storm (target: ours <= 1.2x the floor's), and RSS per stream: RSS with
  the N streams converged minus RSS with one proxy converged, over N (target <= 30 KB; with a
  connection per proxy, --per-channel 1, <= 1.10x the floor's), so one-time work (generating
  and caching the config) is not spread over the streams;
- beside RSS, what each process allocated per stream at the same two moments, as its
  allocators count it (memstats.py: malloc's bytes in use and Python's small objects): RSS
  also moves with memory the process reuses from before the storm or allocates and never
  touches, which these do not; and how much of Python's free room from before the storm
  the streams' objects filled (memory that was resident already, so not in RSS per stream).

SotW and delta, one after the other (--mode to pick one).

Usage: python tests/benchmarks/xds_storm.py [--proxies 5000] [--services 1000] [--endpoints 5]
       [--mode sotw|delta|both] [--per-channel 100]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.benchmarks.memstats import MemProbe
from tests.benchmarks.xds_bench import ControlPlaneRun, FloorRun, ProcStats, machine, metric
from tests.benchmarks.xds_load import LoadClients, LoadOptions, check_acks, percentile
from tests.benchmarks.xds_mesh import MeshFiles


def _reset_peak(pid: int) -> None:
    """Start VmHWM afresh at the current RSS (Linux: clear_refs 5), so the peak is the
    storm's, not the config load's."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


async def sample_admission(cp: ControlPlaneRun, trace: list[tuple[float, float, float]]) -> None:
    """Every second: (time, admission rate, streams rate-limited so far), from /metrics."""
    t0 = time.monotonic()
    while True:
        m = await cp.metrics()
        trace.append(
            (
                time.monotonic() - t0,
                metric(m, "pilotfish_xds_admission_rate"),
                metric(m, "pilotfish_xds_connections_rate_limited_total"),
            )
        )
        await asyncio.sleep(1.0)


async def storm(
    target: str,
    stats: ProcStats,
    probe: MemProbe,
    args: argparse.Namespace,
    delta: bool,
    cp: ControlPlaneRun | None = None,
) -> dict[str, Any]:
    """Warm one proxy, then storm N; returns the figures. With `cp` (ours), the admission
    rate is sampled during the storm."""
    warm_opts = LoadOptions(target, 1, delta=delta, first_index=args.proxies)
    async with LoadClients(warm_opts) as warm:
        await warm.wait_converged(120)
        await asyncio.sleep(1.0)
        rss0 = stats.rss()
        used0 = await probe.sample()
        cpu0 = stats.cpu()
        _reset_peak(stats.pid)
        opts = LoadOptions(
            target, args.proxies, workers=args.workers, delta=delta, per_channel=args.per_channel
        )
        trace: list[tuple[float, float, float]] = []
        sampler = asyncio.create_task(sample_admission(cp, trace)) if cp is not None else None
        async with LoadClients(opts) as load:
            status = await load.wait_converged(args.timeout)
            cpu1 = stats.cpu()
            if sampler is not None:
                sampler.cancel()
                await asyncio.gather(sampler, return_exceptions=True)
            await asyncio.sleep(2.0)  # let buffers of the last responses go
            rss1 = stats.rss()
            used1 = await probe.sample()
            peak = stats.peak_rss()
            records = await load.report()
    first = min(r["connected_at"] for r in records if r["connected_at"])
    done = [r["converged_at"] - first for r in records if r["converged_at"] is not None]
    return {
        "converge": max(done),
        "p50": statistics.median(done),
        "p99": percentile(done, 99),
        "rss_per_stream": (rss1 - rss0) / args.proxies,
        "malloc_per_stream": (used1["malloc"] - used0["malloc"]) / args.proxies,
        "python_per_stream": (used1["python"] - used0["python"]) / args.proxies,
        "python_free": (used0["python_free"], used1["python_free"]),
        "rss_base": rss0,
        "peak": peak,
        "cpu": cpu1 - cpu0,
        "failures": status["failures"],
        "problems": check_acks(records),
        "client_cpu": status["cpu"],
        "admission": trace,
    }


async def run_mode(args: argparse.Namespace, delta: bool) -> bool:
    """One storm on ours and one on the floor; prints the figures; True when it passed."""
    with tempfile.TemporaryDirectory(prefix="pf-storm-") as tmp:
        return await _run_mode(args, delta, Path(tmp))


async def _run_mode(args: argparse.Namespace, delta: bool, tmp: Path) -> bool:
    mesh = MeshFiles(tmp / "mesh", args.services, args.endpoints)
    mesh.write()
    await asyncio.sleep(2.5)  # files older than the watcher's racy window: no re-reads
    cp = ControlPlaneRun(
        mesh.root,
        "--connection-rate",
        str(args.connection_rate),
        "--connection-rate-max",
        str(args.connection_rate_max),
    )
    ours_probe, floor_probe = MemProbe(tmp, "ours"), MemProbe(tmp, "floor")
    cp.proc.args = ours_probe.wrap(cp.proc.args)
    await cp.start()
    try:
        assert cp.stats is not None
        ours_probe.pid = cp.stats.pid
        ours = await storm(cp.target, cp.stats, ours_probe, args, delta, cp)
        m = await cp.metrics()
    except Exception:
        print(cp.log_tail(), file=sys.stderr)
        raise
    finally:
        await cp.close()
    floor_run = FloorRun(mesh.root, args.services)
    floor_run.args = floor_probe.wrap(floor_run.args)
    await floor_run.start()
    try:
        assert floor_run.stats is not None
        floor_probe.pid = floor_run.stats.pid
        floor = await storm(floor_run.target, floor_run.stats, floor_probe, args, delta)
    finally:
        await floor_run.close()

    burst = 2 * args.connection_rate
    mode = "delta" if delta else "sotw"
    rate_limited = metric(m, "pilotfish_xds_connections_rate_limited_total")
    slowdowns = {
        reason: metric(m, f'pilotfish_xds_admission_slowdowns_total{{reason="{reason}"}}')
        for reason in ("lag", "rss")
    }
    cp_errors = metric(m, "pilotfish_xds_stream_errors_total*") + metric(
        m, "pilot_xds_write_timeout_total"
    )
    name = f"storm {mode}"
    print(
        f"{name}: {args.proxies} proxies, {args.services} services x {args.endpoints} "
        f"endpoints, {args.per_channel} streams per connection; adaptive admission from "
        f"{args.connection_rate:g}/s after {burst:g}, at most {args.connection_rate_max:g}/s"
    )
    print(
        f"{name} converge ours: {ours['converge']:.1f} s (per proxy p50 {ours['p50']:.1f} s, "
        f"p99 {ours['p99']:.1f} s); floor (bare grpc.aio, no admission): "
        f"{floor['converge']:.1f} s (p50 {floor['p50']:.1f} s); ratio "
        f"{ours['converge'] / floor['converge']:.2f}  (target <= 1.5)"
    )
    print(
        f"{name} errors ours: {ours['failures']} failed streams, {len(ours['problems'])} "
        f"proxies with problems, {cp_errors:g} control-plane stream/push errors  (target 0); "
        f"floor: {floor['failures']} failed streams"
    )
    trace = ours["admission"]
    rates = " ".join(f"{r:.0f}" for _, r, _ in trace)
    print(
        f"{name} rate limited: {rate_limited:g} streams waited for admission; the rate went "
        f"down {slowdowns['lag']:g} times on event-loop lag, {slowdowns['rss']:g} on RSS growth"
    )
    print(f"{name} admission rate (/s), sampled every second of the storm: {rates}")
    print(
        f"{name} peak RSS ours: {ours['peak'] / 2**20:.0f} MB (before the storm "
        f"{ours['rss_base'] / 2**20:.0f} MB); floor: {floor['peak'] / 2**20:.0f} MB; "
        f"ratio {ours['peak'] / floor['peak']:.2f}  (target <= 1.2)"
    )
    target = "<= 1.10x the floor" if args.per_channel == 1 else "<= 30 KB"
    print(
        f"{name} RSS per stream ours: {ours['rss_per_stream'] / 1024:.1f} KB  "
        f"(target {target}); floor: {floor['rss_per_stream'] / 1024:.1f} KB; "
        f"ratio {ours['rss_per_stream'] / max(1.0, floor['rss_per_stream']):.2f}"
    )
    allocated = [r["malloc_per_stream"] + r["python_per_stream"] for r in (ours, floor)]
    print(
        f"{name} allocated per stream (malloc in use + Python small objects) ours: "
        f"{allocated[0] / 1024:.1f} KB ({ours['malloc_per_stream'] / 1024:.1f} + "
        f"{ours['python_per_stream'] / 1024:.1f}); floor: {allocated[1] / 1024:.1f} KB "
        f"({floor['malloc_per_stream'] / 1024:.1f} + {floor['python_per_stream'] / 1024:.1f}); "
        f"ratio {allocated[0] / max(1.0, allocated[1]):.2f}"
    )
    # The floor generates the config it serves with our generators and keeps only the bytes:
    # what it drops leaves pymalloc room, resident, that the storm's Python objects fill
    # without new pages, so its RSS per stream leaves out memory its streams hold (README
    # footnote 16). Said beside the target's figure, not instead of it.
    free = [r["python_free"] for r in (ours, floor)]
    with_room = [
        r["rss_per_stream"] + max(0, f[0] - f[1]) / args.proxies
        for r, f in zip((ours, floor), free, strict=True)
    ]
    print(
        f"{name} Python's free room (pymalloc, resident) before -> after the storm ours: "
        f"{free[0][0] / 2**20:.1f} -> {free[0][1] / 2**20:.1f} MB; floor: "
        f"{free[1][0] / 2**20:.1f} -> {free[1][1] / 2**20:.1f} MB; RSS per stream counting "
        f"the room the streams filled ours: {with_room[0] / 1024:.1f} KB; floor: "
        f"{with_room[1] / 1024:.1f} KB; ratio {with_room[0] / max(1.0, with_room[1]):.2f}"
    )
    print(
        f"{name} server CPU ours: {ours['cpu']:.1f} s; floor: {floor['cpu']:.1f} s; "
        f"ratio {ours['cpu'] / max(0.01, floor['cpu']):.2f}  "
        f"(clients: {ours['client_cpu']:.0f} s / {floor['client_cpu']:.0f} s CPU)"
    )
    for p in ours["problems"][:5]:
        print(f"{name} problem: {p}")
    return not (ours["failures"] or ours["problems"] or cp_errors)


async def run(args: argparse.Namespace) -> int:
    print(machine())
    modes = (False, True) if args.mode == "both" else (args.mode == "delta",)
    passed = [await run_mode(args, delta) for delta in modes]
    return 0 if all(passed) else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proxies", type=int, default=5000)
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--endpoints", type=int, default=5)
    ap.add_argument("--mode", choices=("sotw", "delta", "both"), default="both")
    ap.add_argument("--workers", type=int, default=0, help="load worker processes (0: by size)")
    ap.add_argument(
        "--per-channel",
        type=int,
        default=100,
        help="streams sharing one connection (1: a connection per proxy, as real sidecars)",
    )
    ap.add_argument("--connection-rate", type=float, default=200.0, help="admission's start")
    ap.add_argument("--connection-rate-max", type=float, default=2000.0)
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()
    import uvloop

    t0 = time.monotonic()
    rc = uvloop.run(run(args))
    print(f"storm benchmark took {time.monotonic() - t0:.0f} s")
    sys.exit(rc)


if __name__ == "__main__":
    main()
