"""Benchmark: endpoint churn. N simulated proxies (xds_load.py) hold the config of S services x
E endpoints; one endpoint moves R times a second for T seconds (a config file rewritten, as
an operator or controller would); how long until every proxy has ACKed each change, what a
push costs, and whether the change reaches EDS only.

Ours: `python -m control` with its defaults (file watcher polling every 0.25 s, 50 ms settle,
100 ms debounce). Each change j moves an endpoint to an address that carries marker j, so a
simulated proxy knows which changes an EDS response holds (xds_sim.py); it records when it
ACKed the first response holding j.

Convergence is reported two ways, per (proxy, change):
- from the push (debounce excluded): from the start of the push that carried the change to
  the proxy's ACK. The control plane's /debug/pushz says when each push started and when the
  config scan it carries began (on the monotonic clock every process here shares); the push
  that carried change j is the first whose scan began after j was written, or, if a proxy had
  j before that push started (a read that caught the file just after the scan), the last one
  started before that proxy's ACK;
- from the write: from the file write to the ACK (adds the watcher's poll, settle and the
  debounce).

Floor, same run: a bare grpc.aio server (xds_floor.py) serving the same bytes to the same
proxies, pushing the same changes at the moments our pushes started (so it carries the same
batches), with nothing else to do; convergence from its push to the ACK. CPU per push: CPU
seconds of the server process over the churn divided by its pushes (ours includes re-reading
the file, rebuilding the index and generating; the floor only writes).

Target: p99 from the push <= 1 s at 1,000 proxies.

Usage: python tests/benchmarks/xds_churn.py [--proxies 1000] [--seconds 60] [--rate 10]
       [--mode sotw|delta|both]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.benchmarks.xds_bench import ControlPlaneRun, FloorRun, machine, metric
from tests.benchmarks.xds_load import LoadClients, LoadOptions, check_acks, percentile
from tests.benchmarks.xds_mesh import MeshFiles

OTHER_TYPES = ("CDS", "LDS", "RDS")


def ack_times(records: list[dict[str, Any]], changes: list[int]) -> dict[int, list[float]]:
    """For each change, the time each proxy ACKed the first response holding it."""
    out: dict[int, list[float]] = {j: [] for j in changes}
    for r in records:
        marks = r["markers"]  # (marker, time), markers increasing
        values = [m for m, _ in marks]
        for j in changes:
            k = bisect.bisect_left(values, j)
            if k < len(marks):
                out[j].append(marks[k][1])
    return out


def attribute(
    changes: list[tuple[int, float]], pushes: list[dict[str, Any]], acks: dict[int, list[float]]
) -> tuple[dict[int, float], int]:
    """The start of the push that carried each change (see the module doc), and how many
    changes needed the fallback rule."""
    starts = sorted(p["started_monotonic"] for p in pushes)
    by_snapshot = sorted(
        (p["config_snapshot_monotonic"], p["started_monotonic"])
        for p in pushes
        if p["config_snapshot_monotonic"] is not None
    )
    out: dict[int, float] = {}
    fallback = 0
    for j, written in changes:
        first_ack = min(acks[j], default=None)
        carried = next((s for snap, s in by_snapshot if snap > written), None)
        if first_ack is not None and (carried is None or carried > first_ack):
            k = bisect.bisect_right(starts, first_ack)
            carried = starts[k - 1] if k else None
            fallback += 1
        if carried is not None:
            out[j] = carried
    return out, fallback


def histogram_quantile(before: dict[str, float], after: dict[str, float], q: float) -> float:
    """Quantile of pilot_proxy_convergence_time over the churn (linear within a bucket)."""
    name = "pilot_proxy_convergence_time_bucket"
    buckets = []
    for key, v in after.items():
        if key.startswith(name + "{"):
            le = key.split('le="')[1].split('"')[0]
            buckets.append((float(le), v - before.get(key, 0.0)))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return float("nan")
    rank, prev_le, prev_n = q * total, 0.0, 0.0
    for le, n in buckets:
        if n >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_n) / max(n - prev_n, 1e-9)
        prev_le, prev_n = le, n
    return prev_le


async def _converge(load: LoadClients, timeout: float) -> dict[str, Any]:
    await load.wait_converged(timeout)
    await asyncio.sleep(1.0)
    await load.forget_markers()
    await asyncio.sleep(0.5)
    return load.status()


async def run_ours(args: argparse.Namespace, mesh: MeshFiles, delta: bool) -> dict[str, Any]:
    cp = ControlPlaneRun(mesh.root)
    await cp.start()
    try:
        assert cp.stats is not None
        opts = LoadOptions(cp.target, args.proxies, delta=delta, workers=args.workers)
        async with LoadClients(opts) as load:
            base = await _converge(load, 300)
            seen = {p["seq"] for p in await cp.pushz()}
            m0 = await cp.metrics()
            cpu0, t0 = cp.stats.cpu(), time.monotonic()
            changes: list[tuple[int, float]] = []
            for n in range(int(args.rate * args.seconds)):
                await asyncio.sleep(max(0.0, t0 + n / args.rate - time.monotonic()))
                j = await asyncio.to_thread(mesh.change)
                changes.append((j, time.monotonic()))
            last = changes[-1][0]
            status = await load.wait_for(
                lambda s: s["marker_min"] >= last, args.timeout, "every proxy to have every change"
            )
            cpu1, t1 = cp.stats.cpu(), time.monotonic()
            records = await load.report()
            pushes = [p for p in await cp.pushz() if p["seq"] not in seen]
            m1 = await cp.metrics()
    except Exception:
        print(cp.log_tail(), file=sys.stderr)
        raise
    finally:
        await cp.close()
    ids = [j for j, _ in changes]
    acks = ack_times(records, ids)
    carried, fallback = attribute(changes, pushes, acks)
    written = dict(changes)
    from_push = [t - carried[j] for j in ids if j in carried for t in acks[j]]
    from_write = [t - written[j] for j in ids for t in acks[j]]
    other = {t: status["responses"].get(t, 0) - base["responses"].get(t, 0) for t in OTHER_TYPES}
    # The schedule the floor replays: when each push started (from the churn's start) and the
    # last change it carried.
    last_of: dict[float, int] = {}
    for j, start in carried.items():
        last_of[start] = max(last_of.get(start, 0), j)
    schedule = sorted((start - t0, j) for start, j in last_of.items())
    return {
        "from_push": from_push,
        "from_write": from_write,
        "samples_expected": len(ids) * args.proxies,
        "pushes": len(pushes),
        "eds_only": sum(1 for p in pushes if p["eds_only"]),
        "other_responses": other,
        "cpu": cpu1 - cpu0,
        "elapsed": t1 - t0,
        "fallback": fallback,
        "unattributed": len(ids) - len(carried),
        "schedule": schedule,
        "changes": len(ids),
        "server_p50": histogram_quantile(m0, m1, 0.5),
        "server_p99": histogram_quantile(m0, m1, 0.99),
        "server_acks": metric(m1, "pilot_proxy_convergence_time_count")
        - metric(m0, "pilot_proxy_convergence_time_count"),
        "problems": check_acks(records),
        "failures": status["failures"],
        "client_cpu": status["cpu"] - base["cpu"],
    }


async def run_floor(
    args: argparse.Namespace, mesh: MeshFiles, delta: bool, schedule: list[tuple[float, int]]
) -> dict[str, Any]:
    floor = FloorRun(mesh.root, args.services)
    await floor.start()
    try:
        assert floor.stats is not None
        opts = LoadOptions(floor.target, args.proxies, delta=delta, workers=args.workers)
        async with LoadClients(opts) as load:
            await _converge(load, 300)
            cpu0, t0 = floor.stats.cpu(), time.monotonic()
            pushed: dict[int, float] = {}
            done = 0
            for offset, j in schedule:
                await asyncio.sleep(max(0.0, t0 + offset - time.monotonic()))
                reply = await floor.command(f"push {j}")
                for i in range(done + 1, j + 1):
                    pushed[i] = reply["t"]
                done = j
            await load.wait_for(lambda s: s["marker_min"] >= done, args.timeout, "floor churn")
            cpu1 = floor.stats.cpu()
            records = await load.report()
    finally:
        await floor.close()
    acks = ack_times(records, sorted(pushed))
    return {
        "from_push": [t - pushed[j] for j in pushed for t in acks[j]],
        "pushes": len(schedule),
        "cpu": cpu1 - cpu0,
    }


def _ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1000:.0f} ms"


async def run(args: argparse.Namespace) -> int:
    modes = ("sotw", "delta") if args.mode == "both" else (args.mode,)
    failed = False
    print(machine())
    for mode in modes:
        with tempfile.TemporaryDirectory(prefix="pf-churn-") as tmp_name:
            tmp = Path(tmp_name)
            ours_mesh = MeshFiles(tmp / "mesh", args.services, args.endpoints)
            ours_mesh.write()
            floor_mesh = MeshFiles(tmp / "floor-mesh", args.services, args.endpoints)
            floor_mesh.write()
            await asyncio.sleep(2.5)  # files older than the watcher's racy window
            ours = await run_ours(args, ours_mesh, mode == "delta")
            floor = await run_floor(args, floor_mesh, mode == "delta", ours["schedule"])
        p99, floor_p99 = percentile(ours["from_push"], 99), percentile(floor["from_push"], 99)
        per_push = ours["cpu"] / max(1, ours["pushes"])
        floor_per_push = floor["cpu"] / max(1, floor["pushes"])
        print(
            f"churn {mode}: {args.proxies} proxies, {args.services} services x {args.endpoints} "
            f"endpoints, {args.rate:g} changes/s for {args.seconds:g} s: {ours['changes']} "
            f"changes in {ours['pushes']} pushes, {ours['eds_only']} of them EDS only; "
            f"CDS/LDS/RDS responses during the churn: {ours['other_responses']}"
        )
        print(
            f"churn {mode} convergence from push start (debounce excluded), per proxy and "
            f"change: ours p50 {_ms(ours['from_push'], 50)}, p99 {_ms(ours['from_push'], 99)}, "
            f"max {max(ours['from_push']) * 1000:.0f} ms; floor p50 "
            f"{_ms(floor['from_push'], 50)}, p99 {_ms(floor['from_push'], 99)}; "
            f"ratio p99 ours/floor {p99 / floor_p99:.2f}  (target: ours p99 <= 1000 ms)"
        )
        print(
            f"churn {mode} convergence from the file write (adds 0.25 s poll, 50 ms settle, "
            f"100 ms debounce): p50 {_ms(ours['from_write'], 50)}, "
            f"p99 {_ms(ours['from_write'], 99)}"
        )
        print(
            f"churn {mode} control plane's own pilot_proxy_convergence_time over the churn: "
            f"{ours['server_acks']:g} ACKs, p50 ~{ours['server_p50'] * 1000:.0f} ms, p99 "
            f"~{ours['server_p99'] * 1000:.0f} ms (interpolated within histogram buckets)"
        )
        print(
            f"churn {mode} CPU per push ours: {per_push * 1000:.1f} ms "
            f"({per_push / args.proxies * 1e6:.0f} us per proxy; re-read, rebuild, generate, "
            f"send); floor: {floor_per_push * 1000:.1f} ms; ratio "
            f"{per_push / max(floor_per_push, 1e-6):.2f}"
        )
        print(
            f"churn {mode} bookkeeping: {len(ours['from_push'])} of "
            f"{ours['samples_expected']} samples, {ours['fallback']} changes attributed by the "
            f"fallback rule, {ours['unattributed']} unattributed, {ours['failures']} stream "
            f"failures, client CPU {ours['client_cpu']:.0f} s over {ours['elapsed']:.0f} s"
        )
        for p in ours["problems"][:5]:
            print(f"churn {mode} problem: {p}")
        if ours["problems"] or ours["failures"] or any(ours["other_responses"].values()):
            failed = True
    return 1 if failed else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proxies", type=int, default=1000)
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--endpoints", type=int, default=5)
    ap.add_argument("--rate", type=float, default=10.0, help="endpoint changes per second")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long the churn lasts")
    ap.add_argument("--mode", choices=("sotw", "delta", "both"), default="both")
    ap.add_argument("--workers", type=int, default=0, help="load worker processes (0: by size)")
    ap.add_argument("--timeout", type=float, default=120.0, help="for the last change to land")
    args = ap.parse_args()
    import uvloop

    t0 = time.monotonic()
    rc = uvloop.run(run(args))
    print(f"churn benchmark took {time.monotonic() - t0:.0f} s")
    sys.exit(rc)


if __name__ == "__main__":
    main()
