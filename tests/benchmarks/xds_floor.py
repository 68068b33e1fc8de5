"""The floor for the xDS scale benchmarks: a bare grpc.aio ADS server, in a process of its own.

It serves the same bytes our control plane would (generated once, at start, from the same
mesh files, for one proxy; every stream gets that proxy's listener), and does nothing else:
no state machine, no generation, no rate limiting, no metrics. A request without a response
nonce, or naming different resources than the last one, is answered with the pre-serialized
response of its type; ACKs are counted. At most 100 streams are written to at once, as our
server's send workers do (without a bound, a storm has gRPC buffer every stream's responses
at once: the floor's memory then measures that, not what a stream costs). What our control
plane takes beyond this is its own cost.

Commands on stdin, one per line: `push J` applies churn changes up to J and sends every
stream one EDS update carrying the moved assignments (as our server does, SotW and delta), printing
when the push started; `status` prints counters and CPU; `stop` ends. Usage (the benchmarks run it):

    python xds_floor.py --mesh DIR --services S
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest, DiscoveryRequest

from control.xds.server import XdsOptions, grpc_stream_options
from protos import typeurls, wire
from protos.ads import raw_ads_handler
from tests.benchmarks.xds_sim import marker_address, proxy_identity
from tests.support.wire import delta_discovery_response, discovery_response

TYPES = (typeurls.CLUSTER, typeurls.ENDPOINT, typeurls.LISTENER, typeurls.ROUTE)


def generate(mesh: Path) -> dict[str, list[tuple[str, str, bytes]]]:
    """(name, version, Any bytes) per type, as our generators make them for proxy 0."""
    from control.config.discovery import discover
    from control.config.loader import load_bytes, read_file
    from control.config.merge import merge
    from control.generate import GENERATORS
    from control.generate.context import GenContext
    from control.model.index import MeshIndex
    from control.model.proxy import proxy_from_node
    from control.xds.cache import ResourceCache

    files = [load_bytes(read_file(f), f) for f in discover([str(mesh)])]
    ctx = GenContext(MeshIndex(merge(files)), ResourceCache())
    ident = proxy_identity(0)
    proxy = proxy_from_node(ident.node_id, ident.metadata())
    out = {}
    for t in TYPES:
        rs = GENERATORS[t](ctx, proxy)
        out[t] = [(n, rs[n].version, rs[n].any_bytes) for n in sorted(rs)]
    return out


class Floor:
    def __init__(self, resources: dict[str, list[tuple[str, str, bytes]]]) -> None:
        self.resources = resources
        self.sotw = {
            t: discovery_response("v0", [a for _, _, a in rs], t, "n0")
            for t, rs in resources.items()
        }
        self.delta = {
            t: delta_discovery_response(
                "v0", [wire.delta_resource(n, v, a) for n, v, a in rs], t, [], "n0"
            )
            for t, rs in resources.items()
        }
        self.queues: set[asyncio.Queue[bytes]] = set()
        self.writers = asyncio.Semaphore(100)
        self.sotw_queues: set[asyncio.Queue[bytes]] = set()
        self.acks = 0
        self.requests = 0
        self.streams = 0
        eds = resources[typeurls.ENDPOINT]
        self._eds_index = {n: i for i, (n, _, _) in enumerate(eds)}
        self._eds = list(eds)
        self.applied = 0  # churn changes applied so far

    async def serve(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext, delta: bool
    ) -> None:
        q: asyncio.Queue[bytes] = asyncio.Queue()
        self.queues.add(q)
        if not delta:
            self.sotw_queues.add(q)
        self.streams += 1
        last_names: dict[str, int] = {}  # type -> hash of the names last asked for
        answers = self.delta if delta else self.sotw

        async def read() -> None:
            # Nothing of a request outlives its handling (an EDS ACK names every cluster).
            while (raw := await context.read()) is not grpc.aio.EOF:
                self.requests += 1
                type_url, acked, names = _request_facts(raw, delta)
                del raw
                if acked:
                    self.acks += 1
                    if delta and names == _NO_NAMES:
                        continue
                    if not delta and last_names.get(type_url) == names:
                        continue
                last_names[type_url] = names
                if type_url in answers:
                    q.put_nowait(answers[type_url])

        reader = asyncio.create_task(read())
        try:
            while True:
                data = await q.get()
                async with self.writers:
                    await context.write(data)
        finally:
            reader.cancel()
            self.queues.discard(q)
            self.sotw_queues.discard(q)
            self.streams -= 1

    def push(self, j: int, services: int) -> int:
        """Apply every change up to j (change i moves endpoint 0 of service (i-1) % services
        to marker i, as xds_mesh does) and queue one EDS update for every stream carrying the
        assignments that moved (SotW allows a subset for EDS; our server sends that too)."""
        moved: dict[int, bytes] = {}
        while self.applied < j:
            self.applied += 1
            i = self.applied
            name = f"outbound|9080||svc-{(i - 1) % services}.default.svc.cluster.local"
            k = self._eds_index[name]
            _, value = _any_from(self._eds[k][2])
            cla = ClusterLoadAssignment.FromString(value)
            address = cla.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
            address.address = marker_address(i)
            new = wire.any_bytes(typeurls.ENDPOINT, cla.SerializeToString())
            self._eds[k] = (name, f"m{i}", new)
            moved[k] = new
        if not moved:
            return 0
        sotw = discovery_response(f"m{j}", list(moved.values()), typeurls.ENDPOINT, f"m{j}")
        delta = delta_discovery_response(
            f"m{j}",
            [wire.delta_resource(self._eds[k][0], self._eds[k][1], a) for k, a in moved.items()],
            typeurls.ENDPOINT,
            [],
            f"m{j}",
        )
        for q in self.queues:
            q.put_nowait(sotw if q in self.sotw_queues else delta)
        return len(self.queues)


_NO_NAMES = hash(())


def _request_facts(raw: bytes, delta: bool) -> tuple[str, bool, int]:
    """(type URL, whether it answers a response, hash of the names it asks for)."""
    req: Any = DeltaDiscoveryRequest.FromString(raw) if delta else DiscoveryRequest.FromString(raw)
    names = req.resource_names_subscribe if delta else req.resource_names
    return req.type_url, bool(req.response_nonce), hash(tuple(names))


def _any_from(data: bytes) -> tuple[str, bytes]:
    from google.protobuf import any_pb2

    a = any_pb2.Any.FromString(data)
    return a.type_url, a.value


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def main(args: argparse.Namespace) -> None:
    floor = Floor(generate(Path(args.mesh)))
    server = grpc.aio.server(
        options=[
            # The same stream limits as ours (control/xds/server.py explains them).
            *grpc_stream_options(XdsOptions()),
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 256 << 20),
        ]
    )

    async def sotw(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        await floor.serve(requests, context, delta=False)

    async def delta(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        await floor.serve(requests, context, delta=True)

    server.add_generic_rpc_handlers((raw_ads_handler(sotw, delta),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    _emit({"event": "ready", "port": port, "pid": os.getpid()})
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode().strip():
        cmd, _, arg = line.partition(" ")
        if cmd == "push":
            t = time.monotonic()
            n = floor.push(int(arg), args.services)
            _emit({"event": "pushed", "j": int(arg), "t": t, "streams": n})
        elif cmd == "status":
            _emit(
                {
                    "event": "status",
                    "acks": floor.acks,
                    "requests": floor.requests,
                    "streams": floor.streams,
                    "cpu": _cpu(),
                }
            )
        elif cmd == "stop":
            break
    await server.stop(0)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mesh", required=True, help="the mesh directory (xds_mesh.MeshFiles)")
    ap.add_argument("--services", type=int, required=True)
    import uvloop

    uvloop.run(main(ap.parse_args()))
