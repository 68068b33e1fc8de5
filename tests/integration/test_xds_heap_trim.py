"""Freed memory goes back to the system after a connection storm (issue 9, RSS per stream).

The server calls its `trim` (glibc's malloc_trim in the control plane) `trim_idle` seconds
after the send queue drains once at least `trim_after_streams` streams were opened since the
last time, in a thread; not after fewer new streams, nor after pushes to the streams already
there (trimming there would only have the next push fault the pages in again; the SotW churn
benchmark's convergence went from under 1 s to 8 s at p99 when pushes trimmed). On the real
gRPC server with real streams.
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


async def _serve_streams(
    options: XdsOptions, trim: _Trim, streams: int, pushes: int = 0
) -> XdsServer:
    """A server with `streams` SotW streams answered (CDS, 200 clusters), then `pushes`
    pushes of changed clusters to them, each answered, then left alone for twice the trim
    delay."""
    source = _Source({typeurls.CLUSTER: _clusters(200)})
    xds = XdsServer(source, Metrics(), options, trim=trim)
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
        for p in range(pushes):
            source.sets[typeurls.CLUSTER] = _clusters(201 + p)
            xds.push_all()
            for stream in opened:
                assert len((await stream.recv()).resources) == 201 + p
            await asyncio.sleep(options.trim_idle * 2 + 0.2)
        for stream in opened:
            await stream.close()
        await xds.close()
        return xds
    finally:
        await bounded_teardown(channel.close(), "client channel close")
        await bounded_teardown(server.stop(0), "server stop")


async def test_memory_is_trimmed_once_after_a_storm_in_a_thread_not_after_pushes() -> None:
    trim = _Trim()
    options = XdsOptions(trim_after_streams=10, trim_idle=0.2)
    xds = await _serve_streams(options, trim, 10, pushes=2)
    assert xds.trims == 1 and len(trim.threads) == 1
    assert trim.threads[0] is not threading.main_thread()


async def test_no_trim_after_fewer_new_streams_than_the_threshold() -> None:
    trim = _Trim()
    xds = await _serve_streams(XdsOptions(trim_after_streams=11, trim_idle=0.2), trim, 10)
    assert xds.trims == 0 and trim.threads == []


async def test_trimming_can_be_turned_off() -> None:
    trim = _Trim()
    xds = await _serve_streams(XdsOptions(trim_after_streams=0, trim_idle=0.2), trim, 10)
    assert xds.trims == 0 and trim.threads == []


def test_malloc_trim_is_found_and_runs_on_glibc() -> None:
    trim = heap.malloc_trim()
    if platform.libc_ver()[0] != "glibc":
        return  # musl, macOS: None, and the server does without
    assert trim is not None
    trim()
