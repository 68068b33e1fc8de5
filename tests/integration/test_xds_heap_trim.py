"""Freed memory goes back to the system after a burst of sends (issue 9, RSS per stream).

The server calls its `trim` (glibc's malloc_trim in the control plane) once the send queue
has drained after at least `trim_after_bytes` of responses, `trim_idle` seconds later, in a
thread; not after pushes smaller than that. On the real gRPC server with real streams.
"""

from __future__ import annotations

import asyncio
import platform
import threading

import grpc
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest

from control import heap
from control.metrics import Metrics
from control.xds.cache import ResourceCache, ResourceSet
from control.xds.server import XdsOptions, XdsServer, grpc_stream_options
from protos import typeurls
from tests.integration.test_xds_server_load import _Source
from tests.support.adsclient import AdsStream, node_id
from tests.support.controlplane import bounded_teardown


def _clusters(n: int) -> ResourceSet:
    cache = ResourceCache()
    return ResourceSet(
        [
            cache.get(typeurls.CLUSTER, f"c{i}", i, lambda i=i: Cluster(name=f"c{i}"))
            for i in range(n)
        ]
    )


class _Trim:
    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def __call__(self) -> None:
        self.threads.append(threading.current_thread())


async def _serve_streams(options: XdsOptions, trim: _Trim, streams: int) -> XdsServer:
    """A server with `streams` SotW streams answered (CDS, 200 clusters), then left alone for
    twice the trim delay."""
    xds = XdsServer(_Source({typeurls.CLUSTER: _clusters(200)}), Metrics(), options, trim=trim)
    server = grpc.aio.server(options=grpc_stream_options(options))
    xds.add_to(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        opened = []
        for i in range(streams):
            stream = AdsStream(channel)
            first = DiscoveryRequest(type_url=typeurls.CLUSTER)
            first.node.id = node_id(f"127.0.9.{i + 1}", pod=f"p{i}")
            first.node.metadata.update({"AUTO_REGISTER": "false"})
            await stream.send(first)
            opened.append(stream)
        for stream in opened:
            assert len((await stream.recv()).resources) == 200
        await asyncio.sleep(options.trim_idle * 2 + 0.2)
        for stream in opened:
            await stream.close()
        await xds.close()
        return xds
    finally:
        await bounded_teardown(channel.close(), "client channel close")
        await bounded_teardown(server.stop(0), "server stop")


async def test_memory_is_trimmed_once_after_a_burst_of_sends_in_a_thread() -> None:
    trim = _Trim()
    # 10 responses of 200 clusters are over 10 KB together: a burst at this threshold.
    xds = await _serve_streams(XdsOptions(trim_after_bytes=10_000, trim_idle=0.2), trim, 10)
    assert xds.trims == 1 and len(trim.threads) == 1
    assert trim.threads[0] is not threading.main_thread()


async def test_no_trim_after_sends_below_the_threshold() -> None:
    trim = _Trim()
    xds = await _serve_streams(XdsOptions(trim_after_bytes=64 << 20, trim_idle=0.2), trim, 10)
    assert xds.trims == 0 and trim.threads == []


async def test_trimming_can_be_turned_off() -> None:
    trim = _Trim()
    xds = await _serve_streams(XdsOptions(trim_after_bytes=0, trim_idle=0.2), trim, 10)
    assert xds.trims == 0 and trim.threads == []


def test_malloc_trim_is_found_and_runs_on_glibc() -> None:
    trim = heap.malloc_trim()
    if platform.libc_ver()[0] != "glibc":
        return  # musl, macOS: None, and the server does without
    assert trim is not None
    trim()
