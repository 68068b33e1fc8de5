"""Simulated Envoy ADS clients (SotW), run in their own process by the benchmarks.

Each stream subscribes like Envoy: CDS wildcard, then EDS for every cluster it received; it
ACKs every response. Usage:

    python ads_clients.py HOST:PORT STREAMS [CHANNELS]

Prints `ready` once every stream has its first EDS response, then keeps ACKing until stdin
closes. Loopback only; bounded by the stream count and by the parent's lifetime.
"""

from __future__ import annotations

import asyncio
import sys

import grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest, DiscoveryResponse

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"


async def one_stream(channel: grpc.aio.Channel, i: int, ready: asyncio.Event, state: dict) -> None:
    call = channel.stream_stream(
        METHOD,
        request_serializer=DiscoveryRequest.SerializeToString,
        response_deserializer=DiscoveryResponse.FromString,
    )()
    req = DiscoveryRequest(type_url=CDS)
    req.node.id = (
        f"sidecar~127.0.{2 + i // 250}.{i % 250 + 1}~bench-{i}.default~default.svc.cluster.local"
    )
    req.node.metadata.update({"AUTO_REGISTER": "false", "NAMESPACE": "default"})
    await call.write(req)
    got_eds = False
    async for resp in call:
        await call.write(
            DiscoveryRequest(
                type_url=resp.type_url,
                version_info=resp.version_info,
                response_nonce=resp.nonce,
                resource_names=[] if resp.type_url == CDS else state.setdefault(i, []),
            )
        )
        if resp.type_url == CDS and not got_eds and i not in state:
            from envoy.config.cluster.v3.cluster_pb2 import Cluster

            names = []
            for any_msg in resp.resources:
                c = Cluster()
                any_msg.Unpack(c)
                names.append(c.name)
            state[i] = sorted(names)
            await call.write(DiscoveryRequest(type_url=EDS, resource_names=state[i]))
        elif resp.type_url == EDS and not got_eds:
            got_eds = True
            state["ready"] = state.get("ready", 0) + 1
            if state["ready"] == state["want"]:
                ready.set()


async def main() -> None:
    target, streams = sys.argv[1], int(sys.argv[2])
    channels_n = int(sys.argv[3]) if len(sys.argv) > 3 else max(1, streams // 100)
    opts = [("grpc.max_receive_message_length", 256 << 20), ("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.insecure_channel(target, options=opts) for _ in range(channels_n)]
    ready = asyncio.Event()
    state: dict = {"want": streams}
    tasks = [
        asyncio.create_task(one_stream(channels[i % channels_n], i, ready, state))
        for i in range(streams)
    ]
    await ready.wait()
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
    for t in tasks:
        t.cancel()
    for ch in channels:
        await ch.close()


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
