"""Envoy's keepalive pings on the agent's sockets do not get it hung up on.

The bootstrap has Envoy ping the agent every 30 s on its ADS, SDS and ALS connections
(`connection_keepalive`). A gRPC server by default allows a ping without data only every 5
minutes and answers the third early one (the fourth ping) with GOAWAY `too_many_pings`:
Envoy's idle ADS and SDS connections were cut every ~2 minutes (a protocol error in Envoy's
stats) and every resource was fetched again. Here Envoy pings every second, so that would
happen within seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agent.envoy.bootstrap import XDS_CLUSTER, BootstrapOptions, build_bootstrap
from agent.unixsocket import xds_socket_server
from protos.ads import raw_ads_handler
from tests.support.envoy import EnvoyProcess
from tests.support.net import pod_ip

pytestmark = pytest.mark.envoy

_HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


async def test_envoy_pinging_an_idle_ads_stream_keeps_its_connection(tmp_path: Path) -> None:
    ip = pod_ip()
    sock = tmp_path / "XDS"
    streams = 0

    async def hold(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        # Envoy's requests are read and never answered: no data goes either way after them.
        nonlocal streams
        streams += 1
        async for _ in requests:
            pass

    server = xds_socket_server(sock)
    await server.start(raw_ads_handler(hold, hold))
    bootstrap = build_bootstrap(
        BootstrapOptions(
            ip=ip, pod_name="pinger", xds_address=f"unix://{sock}", prometheus_port=None
        )
    )
    (xds,) = (c for c in bootstrap["static_resources"]["clusters"] if c["name"] == XDS_CLUSTER)
    http2 = xds["typed_extension_protocol_options"][_HTTP_OPTIONS]["explicit_http_config"]
    http2["http2_protocol_options"]["connection_keepalive"]["interval"] = "1s"
    envoy = EnvoyProcess(bootstrap, tmp_path)
    cluster = f"cluster.{XDS_CLUSTER}"
    envoy.start()
    try:

        async def connected() -> bool:
            return streams == 1 and await envoy.stat(f"{cluster}.upstream_cx_active") == 1

        await envoy.wait_for(connected, what="Envoy's ADS stream")
        # Six pings or more (1 s apart, up to 15% jitter); the default policy hung up at the
        # fourth.
        await asyncio.sleep(7)
        assert await envoy.stat(f"{cluster}.upstream_cx_protocol_error") == 0
        assert await envoy.stat(f"{cluster}.upstream_cx_total") == 1
        assert streams == 1
    finally:
        envoy.stop()
        await server.close(0)
