"""Benchmark: what a ResponseHandler costs the relay (issue 24).

(a) a 1,000-cluster CDS push relayed by an agent with an observe handler on CDS vs an agent
    without one, both subscribed at once to the same control plane and timed on the same
    pushes (push -> whole response received downstream); target: the observed relay keeps
    >= 95% of the plain relay's throughput. The observer decodes every cluster.
(b) idle RSS (--proxy-only, no Envoy) of an agent with a CDS handler registered vs one
    without, same run; target: <= +2 MB (lazy decoding imports one module, not Envoy's
    protos).

Real `python -m agent` subprocesses; the handler comes in through the entry-point group, as a
plug-in's would (a dist-info on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest

from protos import typeurls
from tests.benchmarks.relay import Agent, _cp, mesh_yaml, rss_of
from tests.support.adsclient import AdsStream, node_id

PLUGIN = """\
SEEN = {"clusters": 0}

def count(resources):
    SEEN["clusters"] += sum(1 for r in resources if r.name)

def setup(registry):
    registry.register(
        "type.googleapis.com/envoy.config.cluster.v3.Cluster", count, mode="observe"
    )
"""


def plugin_site(tmp: Path) -> Path:
    site = tmp / "bench-plugin"
    site.mkdir(parents=True, exist_ok=True)
    (site / "pf_bench_observer.py").write_text(PLUGIN)
    info = site / "pf_bench_observer-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pf-bench-observer\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[pilotfish.agent.handlers]\ncds-observer = pf_bench_observer:setup\n"
    )
    return site


def handler_counts(ip: str) -> dict[str, object]:
    """The CDS observer's row of /debug/handlers, plus its mean time per response (decode and
    call) from the duration histogram on /stats/prometheus."""
    with urllib.request.urlopen(f"http://{ip}:15020/debug/handlers", timeout=5) as r:
        rows = json.loads(r.read())
    row: dict[str, object] = next(row for row in rows if row["type_url"] == typeurls.CLUSTER)
    with urllib.request.urlopen(f"http://{ip}:15020/stats/prometheus", timeout=5) as r:
        stats = r.read().decode()
    sums = {}
    for line in stats.splitlines():
        for part in ("sum", "count"):
            name = f"pilotfish_agent_handler_duration_seconds_{part}{{"
            if line.startswith(name) and 'type="Cluster"' in line:
                sums[part] = float(line.rsplit(" ", 1)[1])
    row["mean_seconds"] = sums["sum"] / sums["count"] if sums.get("count") else 0.0
    return row


async def ack(s: AdsStream, resp: object) -> None:
    await s.send(
        DiscoveryRequest(
            type_url=typeurls.CLUSTER,
            response_nonce=resp.nonce,  # type: ignore[attr-defined]
            version_info=resp.version_info,  # type: ignore[attr-defined]
        )
    )


async def observed_throughput(
    tmp: Path, services: int, rounds: int
) -> tuple[list[float], list[float], dict[str, object]]:
    mesh = tmp / "cds.yaml"
    mesh.write_text(mesh_yaml(services))
    site = plugin_site(tmp)
    async with _cp(mesh) as cp:
        plain = Agent(cp, tmp / "agent-plain", "127.79.0.1")
        observed = Agent(cp, tmp / "agent-observed", "127.79.0.2", env={"PYTHONPATH": str(site)})
        agents = {"plain": plain, "observed": observed}
        for a in agents.values():
            await a.wait_socket()
        opts = [("grpc.max_receive_message_length", 256 << 20)]
        channels = {
            m: grpc.aio.insecure_channel(f"unix:{(a.workdir / 'XDS').resolve()}", options=opts)
            for m, a in agents.items()
        }
        streams = {m: AdsStream(ch) for m, ch in channels.items()}
        times: dict[str, list[float]] = {"plain": [], "observed": []}
        try:
            for i, s in enumerate(streams.values()):
                req = DiscoveryRequest(type_url=typeurls.CLUSTER)
                req.node.id = node_id(f"127.79.1.{i + 1}")
                req.node.metadata.update({"AUTO_REGISTER": "false"})
                await s.send(req)
                await ack(s, await s.recv(timeout=60))
            for r in range(rounds):
                mesh.write_text(mesh_yaml(services, cds_variant=r + 1))
                before = cp.watcher.reloads
                while cp.watcher.reloads == before:
                    await asyncio.sleep(0.005)
                t0 = time.monotonic()
                cp.push_now()

                # Both streams receive concurrently: neither is measured "second".
                async def one(mode: str, t0: float) -> None:
                    s = streams[mode]
                    resp = await s.recv(timeout=60)
                    times[mode].append(time.monotonic() - t0)
                    assert len(resp.resources) >= services
                    await ack(s, resp)

                await asyncio.gather(*(one(m, t0) for m in streams))
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            counts = await asyncio.to_thread(handler_counts, "127.79.0.2")
        finally:
            for s in streams.values():
                await s.close()
            for ch in channels.values():
                await ch.close()
            for a in agents.values():
                a.stop()
    return times["plain"], times["observed"], counts


async def idle_rss(tmp: Path) -> tuple[int, int]:
    mesh = tmp / "idle.yaml"
    mesh.write_text(mesh_yaml(5))
    site = plugin_site(tmp)
    async with _cp(mesh) as cp:
        plain = Agent(cp, tmp / "idle-plain", "127.79.0.3")
        observed = Agent(cp, tmp / "idle-observed", "127.79.0.4", env={"PYTHONPATH": str(site)})
        for a in (plain, observed):
            await a.wait_socket()
        await asyncio.sleep(2.0)
        result = rss_of(plain.proc.pid), rss_of(observed.proc.pid)
        plain.stop()
        observed.stop()
    return result


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--clusters", type=int, default=1000)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pf-handlers-"))
    plain, observed, counts = await observed_throughput(tmp, args.clusters, args.rounds)
    p50, o50 = statistics.median(plain), statistics.median(observed)
    ratio = statistics.median(p / o for p, o in zip(plain, observed, strict=True))
    print(
        f"handlers (a) {args.clusters}-cluster CDS push, plain relay: {p50 * 1000:.1f} ms,"
        f" with a CDS observer: {o50 * 1000:.1f} ms: observed throughput {ratio * 100:.0f}%"
        f" of plain (median of paired ratios)  (target >= 95%); observer handled"
        f" {counts['handled']} responses (mean {float(counts['mean_seconds']) * 1000:.1f} ms"  # type: ignore[arg-type]
        f" each, off the relay's path), dropped {counts['observe_dropped']}"
    )
    plain_rss, handler_rss = await idle_rss(tmp)
    print(
        f"handlers (b) idle agent RSS without a handler: {plain_rss / 2**20:.1f} MB, with a CDS"
        f" handler: {handler_rss / 2**20:.1f} MB, {(handler_rss - plain_rss) / 2**20:+.1f} MB"
        "  (target <= +2 MB)"
    )


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
