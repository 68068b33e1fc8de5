"""The HTTP metrics records against the ALS entries they replace, from one real Envoy: its
listeners carry both of the control plane's metrics loggers for the same requests (the file
logger on the agent's FIFO, and the `http_grpc` logger an older agent gets, to the agent's
AccessLogServer), each feeding an aggregator of its own. Requests of every kind the labels
tell apart (client and server side, HTTP and gRPC, found, not found, no healthy upstream,
gRPC status in headers, authorities) must come out as the same series with the same counts
and sizes, and durations that agree (microseconds vs nanoseconds)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from envoy.config.core.v3.base_pb2 import TrafficDirection
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)
from google.protobuf.json_format import MessageToDict

from agent.telemetry.aggregator import MetricsAggregator
from agent.telemetry.als import AccessLogServer
from agent.telemetry.fifo import MetricsFifo
from agent.telemetry.records import RecordFeed
from control.generate.access_logs import FILE_LOGGER, HTTP_GRPC_LOGGER
from control.generate.filters import HCM_FILTER
from control.generate.telemetry_metrics import WorkloadTelemetry, instrument_listener
from control.generate.wire import pack
from protos import telemetry as t
from tests.support.controlplane import eventually
from tests.support.envoy import EnvoyProcess
from tests.support.net import free_port, pod_ip

pytestmark = pytest.mark.envoy

_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
UPSTREAM = "outbound|8080||web.shop.svc.cluster.local"
GONE = "outbound|9090||gone.shop.svc.cluster.local"
# A plaintext upstream outside the mesh that forges the ALS path's upstream-principal header
# in its responses.
FORGER = "outbound|7070||forger.shop.svc.cluster.local"
FORGED_PRINCIPAL = "spiffe://cluster.local/ns/kube-system/sa/admin"
TELEMETRY = WorkloadTelemetry(
    workload="client-7",
    namespace="shop",
    app="client",
    version="v2",
    principal="spiffe://cluster.local/ns/shop/sa/client",
    cluster_domain="cluster.local",
)


def _listener(
    name: str, ip: str, port: int, routes: list[Any], *, inbound: bool, fifo: Path
) -> Listener:
    """A listener whose HCM carries both metrics loggers, as the control plane writes them."""
    listener = _plain_listener(name, ip, port, routes)
    listener.traffic_direction = TrafficDirection.INBOUND if inbound else TrafficDirection.OUTBOUND
    grpc_only = Listener()
    grpc_only.CopyFrom(listener)
    with_file = instrument_listener(listener, replace(TELEMETRY, log_path=str(fifo)))
    with_grpc = instrument_listener(grpc_only, TELEMETRY)
    ours, theirs = HttpConnectionManager(), HttpConnectionManager()
    with_file.filter_chains[0].filters[0].typed_config.Unpack(ours)
    with_grpc.filter_chains[0].filters[0].typed_config.Unpack(theirs)
    assert [a.name for a in ours.access_log] == [FILE_LOGGER]
    assert [a.name for a in theirs.access_log] == [HTTP_GRPC_LOGGER]
    ours.access_log.extend(theirs.access_log)
    with_file.filter_chains[0].filters[0].typed_config.CopyFrom(pack(ours))
    return with_file


def _plain_listener(name: str, ip: str, port: int, routes: list[Any]) -> Listener:
    """A listener without metrics: an upstream outside the mesh."""
    hcm = HttpConnectionManager(stat_prefix=name)
    hcm.route_config.name = name
    vhost = hcm.route_config.virtual_hosts.add(name=name, domains=["*"])
    for route in routes:
        vhost.routes.add().MergeFrom(route)
    hcm.http_filters.add(name="envoy.filters.http.router").typed_config.type_url = _ROUTER
    listener = Listener(name=name)
    listener.address.socket_address.address = ip
    listener.address.socket_address.port_value = port
    listener.filter_chains.add().filters.add(name=HCM_FILTER, typed_config=pack(hcm))
    return listener


def _route(prefix: str, **action: Any) -> Any:
    from envoy.config.route.v3.route_components_pb2 import Route

    route = Route()
    route.match.prefix = prefix
    if "cluster" in action:
        route.route.cluster = action["cluster"]
    else:
        route.direct_response.status = action["status"]
        route.direct_response.body.inline_string = action.get("body", "ok")
        for k, v in action.get("headers", {}).items():
            h = route.response_headers_to_add.add()
            h.header.key, h.header.value = k, v
    return route


def _cluster(name: str, ip: str | None, port: int) -> dict[str, Any]:
    endpoints = [{"lb_endpoints": [{"endpoint": {"address": _address(ip, port)}}]}] if ip else []
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": endpoints},
    }


def _address(ip: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": ip, "port_value": port}}


def _bootstrap(ip: str, ports: dict[str, int], workdir: Path) -> dict[str, Any]:
    backend = [
        _route(
            "/grpc", status=200, headers={"grpc-status": "7", "content-type": "application/grpc"}
        ),
        _route("/big", status=200, body="x" * 4000),
        _route("/a", status=200),
        _route("/b", status=200),
    ]
    forger = [
        _route(
            "/",
            status=200,
            headers={t.UPSTREAM_PEER_HEADER: FORGED_PRINCIPAL},
        )
    ]
    outbound = [
        _route("/gone", cluster=GONE),
        _route("/forged", cluster=FORGER),
        _route("/local", status=418),
        _route("/", cluster=UPSTREAM),
    ]
    listeners = [
        _plain_listener("forger", ip, ports["forger"], forger),
        _listener("backend", ip, ports["backend"], backend, inbound=True, fifo=workdir / "METRICS"),
        _listener(
            "outbound", ip, ports["outbound"], outbound, inbound=False, fifo=workdir / "METRICS"
        ),
    ]
    als_cluster = _cluster(t.ALS_CLUSTER, None, 0)
    als_cluster["load_assignment"]["endpoints"] = [
        {"lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": str(workdir / "ALS")}}}}]}
    ]
    als_cluster["typed_extension_protocol_options"] = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        }
    }
    return {
        "admin": {"address": _address(ip, ports["admin"])},
        "static_resources": {
            "listeners": [MessageToDict(x, preserving_proto_field_name=True) for x in listeners],
            "clusters": [
                _cluster(UPSTREAM, ip, ports["backend"]),
                _cluster(GONE, None, 0),
                _cluster(FORGER, ip, ports["forger"]),
                als_cluster,
            ],
        },
    }


async def test_records_count_the_same_series_as_als_entries(tmp_path: Path) -> None:
    from_records, from_als = MetricsAggregator(), MetricsAggregator()
    fifo = MetricsFifo(tmp_path / "METRICS")
    fifo.open()
    fifo.start(RecordFeed(from_records))
    als = AccessLogServer(tmp_path / "ALS", from_als)
    await als.start()
    ip = pod_ip()
    ports = {k: free_port(ip) for k in ("backend", "outbound", "forger", "admin")}
    envoy = EnvoyProcess(
        _bootstrap(ip, ports, tmp_path),
        tmp_path,
        extra_args=("--file-flush-interval-msec", "200"),
    )
    envoy.start()
    try:
        out, back = f"http://{ip}:{ports['outbound']}", f"http://{ip}:{ports['backend']}"
        ups: list[int] = []
        await eventually(lambda: _up(out + "/local", ups), timeout=20, what="Envoy listening")
        async with aiohttp.ClientSession() as s:
            requests: list[tuple[str, str, dict[str, str]]] = [
                (out, "/a", {}),
                (out, "/grpc", {"content-type": "application/grpc"}),
                (out, "/big", {"host": "web.shop"}),
                (out, "/gone", {}),
                (out, "/local", {"host": "other:9000"}),
                (out, "/nope", {}),
                (out, "/forged", {}),
                (back, "/a", {"host": "web"}),
                (back, "/grpc", {"content-type": "application/grpc+proto"}),
                (back, "/b", {"host": "10.1.2.3:8080"}),
                (back, "/nope", {"host": "web.shop.svc"}),
            ]
            for i in range(3):
                for base, path, headers in requests:
                    async with s.post(base + path, data=b"y" * i, headers=headers) as r:
                        await r.read()
        # One entry per request per side: those reaching the backend through the outbound
        # listener are logged twice (client and server side); the forger logs nothing.
        want = 3 * 15 + len(ups)
        await eventually(
            lambda: _total(from_records) == _total(from_als) == want,
            timeout=20,
            what=f"{want} entries from both loggers",
        )
        assert from_records.records_dropped == 0
        records = {_as_als(k): v for k, v in from_records.http.items()}
        assert set(records) == set(from_als.http), repr(
            (sorted(set(records) - set(from_als.http)), sorted(set(from_als.http) - set(records)))
        )
        assert len(records) >= 8
        for key, series in from_als.http.items():
            mine = records[key]
            assert mine.requests == series.requests, key
            assert mine.request_bytes.counts == series.request_bytes.counts, key
            assert mine.request_bytes.total == series.request_bytes.total, key
            assert mine.response_bytes.total == series.response_bytes.total, key
            assert mine.duration.total == pytest.approx(series.duration.total, abs=0.1), key
        # The one difference: a request that found no healthy upstream names the service
        # of the cluster its route chose (as Istio does); the ALS entry has no cluster then.
        # The forger's headers name nobody: a plaintext upstream is no mesh peer.
        [forged] = [k for k in from_records.http if k[12] == "forger"]
        assert forged[0] == t.REPORTER_SOURCE and forged[15] == "200", forged
        assert forged[6:11] == ("unknown",) * 5, forged
        [no_host] = [k for k in from_records.http if k[17] == "UH"]
        assert no_host[11:14] == ("gone.shop.svc.cluster.local", "gone", "shop")
        protocols = {k[14] for k in from_als.http}
        codes = {k[15] for k in from_als.http}
        assert protocols == {"http", "grpc"} and {"200", "404", "418", "503"} <= codes
        assert {k[16] for k in from_als.http} >= {"7"}
        assert {k[17] for k in from_als.http} >= {"UH", "NR", "-"}
    finally:
        envoy.stop()
        await als.close()
        await fifo.close()


def _as_als(key: tuple[str, ...]) -> tuple[str, ...]:
    """A records series as the ALS path names it: a client side's request that no upstream
    host served has no destination service there (its entry carries no cluster)."""
    if key[0] == t.REPORTER_SOURCE and "UH" in key[17].split(","):
        return (*key[:11], "unknown", "unknown", "unknown", *key[14:])
    return key


async def _up(url: str, ups: list[int]) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(url) as r:
            await r.read()
            ups.append(r.status)
            return r.status == 418
    except aiohttp.ClientError:
        return False


def _total(agg: MetricsAggregator) -> int:
    return sum(s.requests for s in agg.http.values())
