"""Benchmark: push fan-out to N SotW ADS streams, against a bare grpc.aio floor.

Ours: the real control plane (in this process) with S services x E endpoints; N simulated
Envoys (the load tool, xds_load.py, in worker processes of their own) subscribe to CDS and
EDS. One endpoint changes; we time from push start (debounce excluded: the push is triggered
directly) until every stream has ACKed the new EDS response, and count how many resources
were serialized.

Floor, same run: a bare grpc.aio server that pushes the same pre-serialized EDS response
bytes (the assignment that changed) to N streams of the same client process and waits for the ACKs.

That floor answers CDS with no clusters, so its clients subscribe to no EDS names and their
ACKs are a few dozen bytes, where ours name every cluster (S of them: ~5 KB with 100). A second
floor, printed beside the first and not instead of it, answers CDS with the clusters ours
serves (and EDS at first with their assignments), so that its clients subscribe and ACK as
ours do; the push and its bytes are the same.

Prints one line per figure; ratios are what to read (the machine is shared and noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from control.app import ControlPlane, ControlPlaneOptions
from control.xds.admission import AdmissionLimits
from control.xds.server import XdsOptions, grpc_stream_options
from protos import typeurls
from tests.benchmarks.xds_load import LoadClients, LoadOptions
from tests.support.wire import discovery_response


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def mesh_yaml(services: int, endpoints: int, changed: bool) -> str:
    docs = []
    for s in range(services):
        docs.append(
            f"apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{s}, namespace: default}}\n"
            f"spec:\n  selector: {{app: svc-{s}}}\n"
            f"  ports: [{{name: http, port: 9080, targetPort: 8080}}]\n"
        )
        for e in range(endpoints):
            last = 10 + e + (100 if changed and s == 0 and e == 0 else 0)
            docs.append(
                "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\n"
                f"metadata: {{name: svc-{s}-{e}, namespace: default}}\n"
                f'spec: {{address: "10.{s // 250}.{s % 250}.{last}", labels: {{app: svc-{s}}}}}\n'
            )
    return "---\n".join(docs)


async def clients(target: str, streams: int, first: int = 0) -> LoadClients:
    """Simulated Envoys subscribed to CDS and EDS, each holding its first EDS response."""
    load = LoadClients(LoadOptions(target, streams, lds=False, first_index=first))
    await load.start()
    await load.wait_for(
        lambda s: s["converged_now"] == streams and s["acks"].get("EDS", 0) >= streams,
        300,
        "every stream's first EDS response",
    )
    return load


async def marginal_rss(target: str, streams: int) -> tuple[float, LoadClients]:
    """RSS per connected stream: what `streams` more streams cost once one stream has been
    served, so one-time work (generating and caching the config, loading descriptors, the
    client's channels) is not spread over the streams. The same method for ours and the
    floor."""
    warm = await clients(target, 1, first=streams)
    await asyncio.sleep(0.5)
    rss0 = rss_bytes()
    load = await clients(target, streams)
    await asyncio.sleep(0.5)
    per_stream = (rss_bytes() - rss0) / streams
    await warm.close()
    return per_stream, load


async def wait_acks(counter: object, attr: str, target: int, timeout: float = 120) -> float:
    deadline = time.monotonic() + timeout
    while getattr(counter, attr) < target:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{attr}={getattr(counter, attr)} < {target}")
        await asyncio.sleep(0.001)
    return time.monotonic()


async def run_ours(
    streams: int, services: int, endpoints: int, rounds: int
) -> tuple[list[float], list[int], float]:
    tmp = Path(tempfile.mkdtemp(prefix="pf-bench-"))
    mesh = tmp / "mesh.yaml"
    mesh.write_text(mesh_yaml(services, endpoints, changed=False))
    opts = ControlPlaneOptions(
        config_paths=(str(mesh),),
        xds_address="127.0.0.1:0",
        http_address="127.0.0.1:0",
        debounce_quiet=3600,  # pushes are triggered by hand: debounce excluded
        debounce_max=3600,
        config_poll_interval=0.05,
        xds=XdsOptions(admission=AdmissionLimits(rate=10_000, burst=10_000, max_rate=10_000)),
    )
    cp = ControlPlane(opts)
    await cp.start()
    # The watcher re-reads files written in the last two seconds (it cannot trust mtimes for
    # those); let that settle so the RSS baseline holds only the control plane itself.
    await asyncio.sleep(2.5)
    target = f"127.0.0.1:{cp.xds_port}"
    rss_per_stream, load = await marginal_rss(target, streams)
    times: list[float] = []
    serialized: list[int] = []
    for r in range(rounds):
        mesh.write_text(mesh_yaml(services, endpoints, changed=(r % 2 == 0)))
        version = cp.watcher.reloads
        while cp.watcher.reloads == version:
            await asyncio.sleep(0.01)
        before_ser = cp.cache.serializations
        before_acks = cp.xds.acks
        t0 = time.monotonic()
        cp.push_now()
        t1 = await wait_acks(cp.xds, "acks", before_acks + streams)
        times.append(t1 - t0)
        serialized.append(cp.cache.serializations - before_ser)
    await load.close()
    await cp.close(0)
    return times, serialized, rss_per_stream


class FloorServer:
    """A bare grpc.aio ADS server: pre-serialized bytes, no state beyond a queue per stream."""

    def __init__(self, cds: bytes, eds: bytes) -> None:
        self.cds, self.eds = cds, eds
        self.queues: list[asyncio.Queue[bytes]] = []
        self.acks = 0
        self.ready = 0

    async def handler(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> None:
        q: asyncio.Queue[bytes] = asyncio.Queue()
        self.queues.append(q)

        async def read() -> None:
            async for raw in requests:
                req = DiscoveryRequest.FromString(raw)
                if req.response_nonce:
                    self.acks += 1
                elif req.type_url == typeurls.CLUSTER:
                    q.put_nowait(self.cds)
                else:
                    q.put_nowait(self.eds)

        reader = asyncio.create_task(read())
        try:
            while True:
                await context.write(await q.get())
        finally:
            reader.cancel()


async def run_floor(
    streams: int, cds: bytes, eds: bytes, rounds: int, first_eds: bytes | None = None
) -> tuple[list[float], float]:
    """Push `eds` to every stream `rounds` times; `first_eds` (default `eds`) answers the
    clients' EDS requests."""
    floor = FloorServer(cds, eds if first_eds is None else first_eds)
    # The same stream limits as ours (without them, thousands of streams opened at once
    # are refused by gRPC's backlog limit: control/xds/server.py).
    server = grpc.aio.server(options=grpc_stream_options(XdsOptions()))
    ident = lambda b: b  # noqa: E731
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "envoy.service.discovery.v3.AggregatedDiscoveryService",
                {
                    "StreamAggregatedResources": grpc.stream_stream_rpc_method_handler(
                        floor.handler, request_deserializer=ident, response_serializer=ident
                    )
                },
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    rss_per_stream, load = await marginal_rss(f"127.0.0.1:{port}", streams)
    times = []
    for _ in range(rounds):
        before = floor.acks
        t0 = time.monotonic()
        for q in floor.queues:
            q.put_nowait(eds)
        t1 = await wait_acks(floor, "acks", before + streams)
        times.append(t1 - t0)
    await load.close()
    await server.stop(0)
    return times, rss_per_stream


def generated(type_url: str, services: int, endpoints: int, changed: bool) -> dict[str, bytes]:
    """What our generators make of the bench mesh for a simulated proxy: name -> Any bytes."""
    from control.config.loader import load_text
    from control.config.merge import merge
    from control.generate import GENERATORS
    from control.generate.context import GenContext
    from control.model.index import MeshIndex
    from control.model.proxy import proxy_from_node
    from control.xds.cache import ResourceCache

    proxy = proxy_from_node("sidecar~127.0.2.1~bench-0.default~default.svc.cluster.local", {})
    mesh = MeshIndex(merge([load_text(mesh_yaml(services, endpoints, changed), "m.yaml")]))
    found = GENERATORS[type_url](GenContext(mesh, ResourceCache()), proxy)
    return {n: found[n].any_bytes for n in sorted(found)}


def eds_response_bytes(before: dict[str, bytes], services: int, endpoints: int) -> bytes:
    """The EDS response a simulated proxy gets from our generators when one endpoint moves,
    for the floor to push; `before`: the assignments before the move (`generated`)."""
    after = generated(typeurls.ENDPOINT, services, endpoints, True)
    # What our server sends on this push: the assignments that changed (SotW allows a subset
    # for EDS, see control/xds/sotw.py).
    moved = [after[n] for n in after if after[n] != before[n]]
    assert moved, "the change must move an endpoint"
    return discovery_response("v", moved, typeurls.ENDPOINT, "n")


async def role(args: argparse.Namespace) -> dict[str, object]:
    if args.role == "ours":
        times, serialized, rss = await run_ours(
            args.streams, args.services, args.endpoints, args.rounds
        )
        return {"times": times, "serialized": serialized, "rss_per_stream": rss}
    first = generated(typeurls.ENDPOINT, args.services, args.endpoints, False)
    eds = eds_response_bytes(first, args.services, args.endpoints)
    if args.role == "floor-names":
        # Our clusters, so the clients subscribe to their assignments by name, and all of
        # those first (a client that lacks one has not converged).
        clusters = generated(typeurls.CLUSTER, args.services, args.endpoints, False)
        cds = discovery_response("v", list(clusters.values()), typeurls.CLUSTER, "c")
        first_eds = discovery_response("v0", list(first.values()), typeurls.ENDPOINT, "n0")
    else:
        cds = discovery_response("v", [], typeurls.CLUSTER, "c")
        first_eds = eds
    times, rss = await run_floor(args.streams, cds, eds, args.rounds, first_eds)
    return {"times": times, "rss_per_stream": rss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--services", type=int, default=100)
    ap.add_argument("--endpoints", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--role", choices=("ours", "floor", "floor-names"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        import uvloop

        print(json.dumps(uvloop.run(role(args))), flush=True)
        return
    # Each side runs in a fresh process of its own, so RSS figures do not leak into each other.
    results = {}
    for name in ("ours", "floor", "floor-names"):
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--role",
                name,
                "--streams",
                str(args.streams),
                "--services",
                str(args.services),
                "--endpoints",
                str(args.endpoints),
                "--rounds",
                str(args.rounds),
            ],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:  # say why, not only that it failed
            print(f"push_fanout {name} failed:\n{out.stderr[-3000:]}", file=sys.stderr)
            sys.exit(1)
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    ours, floor = results["ours"], results["floor"]
    ours_p50 = statistics.median(ours["times"])
    floor_p50 = statistics.median(floor["times"])
    print(f"streams: {args.streams}, services: {args.services} x {args.endpoints} endpoints")
    print(
        f"push_fanout ours  p50: {ours_p50 * 1000:.1f} ms  "
        f"(all: {[round(t * 1000) for t in ours['times']]})"
    )
    print(
        f"push_fanout floor p50: {floor_p50 * 1000:.1f} ms  "
        f"(all: {[round(t * 1000) for t in floor['times']]})"
    )
    print(f"push_fanout ratio ours/floor: {ours_p50 / floor_p50:.2f}  (target <= 1.3, issue 23)")
    named_p50 = statistics.median(results["floor-names"]["times"])
    print(
        f"push_fanout floor with our subscriptions p50: {named_p50 * 1000:.1f} ms  "
        f"(all: {[round(t * 1000) for t in results['floor-names']['times']]}); "
        f"ratio ours/it: {ours_p50 / named_p50:.2f}  (beside the target's floor, not instead)"
    )
    print(f"serializations per push (one endpoint changed): {ours['serialized']}  (target: 1 each)")
    print(
        f"server RSS per stream: {ours['rss_per_stream'] / 1024:.1f} KB  (target <= 30 KB); "
        f"bare grpc.aio floor: {floor['rss_per_stream'] / 1024:.1f} KB"
    )


if __name__ == "__main__":
    main()
