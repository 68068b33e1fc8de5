"""Istio's standard metrics end to end: two pods (agent + Envoy + app each), mTLS STRICT
between them, a real Prometheus scraping both agents' `/stats/prometheus`, and PromQL over
what it stored.

- 200 requests client → backend, 20 of them answered 503 by a VirtualService fault abort (on
  the client's sidecar, as in Istio: the destination never sees those, so they are counted by
  the source reporter, flag FI); the backend reports 180 OKs, with the client's SPIFFE ID,
  `mutual_tls`, both workloads' labels — although the client app sent forged peer metadata
  (Istio's headers and ours of old: no header says who anyone is, the agents name peers from
  the control plane's table by address and certificate).
- `histogram_quantile` over the duration buckets has a value.
- A TCP client's bytes through the mesh match the TCP byte counters within 1%.
- A plaintext caller from outside the mesh that forges the peer-metadata headers (to a
  PERMISSIVE port) is `unknown`.
"""

from __future__ import annotations

import asyncio
import math
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.apps import EchoApp, TcpEchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.mesh import mesh_agent, workload_group_yaml
from tests.support.net import pod_ip
from tests.support.prometheus import PrometheusServer

pytestmark = pytest.mark.envoy

HTTP_PORT, OPEN_PORT, TCP_PORT = 9080, 9081, 9090
APP_HTTP, APP_TCP = 8080, 8090
CLIENT_ID = "spiffe://cluster.local/ns/default/sa/client"
BACKEND_ID = "spiffe://cluster.local/ns/default/sa/backend"
# What a caller might send to pass for another workload: Istio's metadata exchange headers
# and the one Pilotfish once used. Nothing reads them.
FORGED = {
    "x-envoy-peer-metadata-id": "sidecar~10.9.9.9~evil-1.default~default.svc.cluster.local",
    "x-envoy-peer-metadata": "ChYKBE5BTUUSDhoMZXZpbC0xCgRldmls",
    "x-pilotfish-peer-metadata": "workload=evil&workload_namespace=default&app=evil&version=v9",
}

MESH = textwrap.dedent(
    f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: backend, namespace: default}}
        spec:
          selector: {{app: backend}}
          ports:
          - {{name: http, port: {HTTP_PORT}}}
          - {{name: http-open, port: {OPEN_PORT}}}
          - {{name: tcp, port: {TCP_PORT}}}
        ---
        apiVersion: networking.istio.io/v1
        kind: Sidecar
        metadata: {{name: backend, namespace: default}}
        spec:
          workloadSelector: {{labels: {{app: backend}}}}
          ingress:
          - port: {{number: {HTTP_PORT}, protocol: HTTP, name: http}}
            defaultEndpoint: 0.0.0.0:{APP_HTTP}
          - port: {{number: {OPEN_PORT}, protocol: HTTP, name: http-open}}
            defaultEndpoint: 0.0.0.0:{APP_HTTP}
          - port: {{number: {TCP_PORT}, protocol: TCP, name: tcp}}
            defaultEndpoint: 0.0.0.0:{APP_TCP}
        ---
        apiVersion: security.istio.io/v1
        kind: PeerAuthentication
        metadata: {{name: backend, namespace: default}}
        spec:
          selector: {{matchLabels: {{app: backend}}}}
          mtls: {{mode: STRICT}}
          portLevelMtls:
            {OPEN_PORT}: {{mode: PERMISSIVE}}
        ---
        apiVersion: networking.istio.io/v1
        kind: VirtualService
        metadata: {{name: backend, namespace: default}}
        spec:
          hosts: [backend]
          http:
          - match: [{{headers: {{x-fault: {{exact: abort}}}}}}]
            fault: {{abort: {{httpStatus: 503, percentage: {{value: 100}}}}}}
            route: [{{destination: {{host: backend}}}}]
          - route: [{{destination: {{host: backend}}}}]
        ---
        """
) + workload_group_yaml("backend", labels={"app": "backend", "version": "v1"})


async def _get(url: str, host: str, headers: dict[str, str]) -> int:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s,
            s.get(url, headers={"Host": host, **headers}) as r,
        ):
            await r.read()
            return r.status
    except (aiohttp.ClientError, TimeoutError):
        return 0


async def _tcp_roundtrip(ip: str, port: int, chunks: int, size: int) -> int:
    """Send `chunks` x `size` bytes through the echo server and read them back; the bytes
    sent (the greeting line is the server's)."""
    reader, writer = await asyncio.open_connection(ip, port)
    try:
        await reader.readline()
        block = b"x" * size
        for _ in range(chunks):
            writer.write(block)
            await writer.drain()
            await reader.readexactly(size)
        return chunks * size
    finally:
        writer.close()
        await writer.wait_closed()


def _label_differences(series: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The labels in which the series differ, and each one's value: what an assertion shows."""
    keys = {k for s in series for k in s["metric"]}
    differ = sorted(k for k in keys if len({s["metric"].get(k) for s in series}) > 1)
    return [{**{k: s["metric"].get(k) for k in differ}, "value": s["value"][1]} for s in series]


async def test_standard_metrics_in_prometheus(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    client_ip, backend_ip = pod_ip(), pod_ip()
    app = EchoApp("backend", backend_ip, APP_HTTP)
    echo = TcpEchoApp("backend", backend_ip, APP_TCP)
    await app.start()
    await echo.start()
    prom = PrometheusServer(tmp_path / "prom", [f"{client_ip}:15020", f"{backend_ip}:15020"])
    async with running_control_plane(cfg) as cp:
        backend = mesh_agent(
            cp, tmp_path, backend_ip, "backend-0", "app=backend,version=v1", group="backend"
        )
        client = mesh_agent(
            cp, tmp_path, client_ip, "client", "app=client,version=v2", service_account="client"
        )
        backend.start()
        client.start()
        prom.start()
        try:
            url = f"http://{client_ip}:{HTTP_PORT}/hello"
            await eventually(
                lambda: _ok(_get(url, "backend", {})), timeout=40, what="client -> backend"
            )
            await eventually(prom.ready, timeout=30, what="prometheus ready")

            # Stored before the burst (a rate needs a sample from before the increase), and
            # named on both sides: the client's row reaches the backend's agent with the push
            # its connection caused, and requests before that are `unknown`, so the warm-up
            # goes on until both sides name the other.
            async def named_both_ways() -> bool:
                await _get(url, "backend", {})
                for promql in (
                    'istio_requests_total{reporter="destination",source_workload="client"}',
                    'istio_requests_total{reporter="source",destination_workload="backend"}',
                ):
                    if not await prom.query(promql):
                        return False
                return True

            await eventually(named_both_ways, timeout=60, what="the warm-up named and scraped")
            before = len(app.headers_seen)

            # The client app forges peer metadata on every request: its sidecar replaces it.
            statuses = await asyncio.gather(
                *(
                    _get(
                        url,
                        "backend",
                        {**FORGED, **({"x-fault": "abort"} if i % 10 == 0 else {})},
                    )
                    for i in range(200)
                )
            )
            assert statuses.count(200) == 180 and statuses.count(503) == 20, statuses

            sent = await _tcp_roundtrip(client_ip, TCP_PORT, chunks=100, size=10_000)

            # A caller outside the mesh, plaintext, straight to the backend's inbound port.
            outside = f"http://{backend_ip}:{OPEN_PORT}/outside"
            forged = [await _get(outside, "backend", FORGED) for _ in range(5)]
            assert forged == [200] * 5

            dest = 'reporter="destination",destination_app="backend"'
            # Exact against what the backend app served to the client over mTLS: the 180 and
            # the warm-up requests that got through.
            served = sum(CLIENT_ID in _xfcc(h) for h in app.headers_seen)
            assert served - sum(CLIENT_ID in _xfcc(h) for h in app.headers_seen[:before]) == 180

            async def count(promql: str, want: float) -> float | None:
                got = await prom.value(promql)
                return got if got == want else None

            # By the client's certificate: the warm-up's first requests may be `unknown`.
            ok_query = (
                f'sum(istio_requests_total{{{dest},response_code="200",'
                f'destination_service_name="backend",source_principal="{CLIENT_ID}"}})'
            )
            await eventually(
                lambda: count(ok_query, served), timeout=60, what="180 OKs in prometheus"
            )
            assert await prom.value(f'sum(istio_requests_total{{{dest},response_code="503"}})') in (
                None,
                0.0,
            )
            # The aborted requests never left the client: its sidecar reports them.
            aborted = (
                'sum(istio_requests_total{reporter="source",source_workload="client",'
                'destination_service="backend.default.svc.cluster.local",'
                'response_code="503",response_flags="FI"})'
            )
            await eventually(lambda: count(aborted, 20), timeout=30, what="20 aborts")

            series = await prom.query(
                f'istio_requests_total{{{dest},response_code="200",source_workload="client"}}'
            )
            # The backend is named after its WorkloadGroup from its first config on, which
            # can predate its registration (it was the pod's name, `backend-0`, until then).
            assert {s["metric"]["destination_workload"] for s in series} == {"backend"}, (
                _label_differences(series)
            )
            # The burst's series; should the warm-up have left others beside it, they must fit
            # in the warm-up's requests.
            burst = max(series, key=lambda s: float(s["value"][1]))
            others = sum(float(s["value"][1]) for s in series if s is not burst)
            assert others <= before, _label_differences(series)
            # Every request of the burst named its caller (the table had arrived).
            assert float(burst["value"][1]) >= 180, series
            labels = burst["metric"]
            assert labels["source_principal"] == CLIENT_ID
            assert labels["destination_principal"] == BACKEND_ID
            assert labels["connection_security_policy"] == "mutual_tls"
            assert labels["source_app"] == "client" and labels["source_version"] == "v2"
            assert labels["source_workload_namespace"] == "default"
            assert labels["destination_workload"] == "backend"  # the WorkloadGroup
            assert labels["destination_version"] == "v1"
            assert labels["destination_service"] == "backend.default.svc.cluster.local"
            assert labels["request_protocol"] == "http"
            assert labels["response_flags"] == "-"
            assert "grpc_response_status" not in labels  # empty: Prometheus drops it

            # The client side named the backend from the control plane's peer table, by its
            # address and the principal its certificate names. (Requests of the warm-up may
            # have gone out before the table reached the client's agent: `unknown` then.)
            named = (
                'istio_requests_total{reporter="source",source_workload="client",'
                'response_code="200",destination_workload!="unknown"}'
            )

            async def burst_counted() -> list[dict[str, Any]] | None:
                got = await prom.query(named)
                return got if len(got) != 1 or float(got[0]["value"][1]) >= 180 else None

            source = await eventually(burst_counted, timeout=30, what="the source side's OKs")
            assert len(source) == 1, source
            assert source[0]["metric"]["destination_app"] == "backend"
            assert source[0]["metric"]["destination_principal"] == BACKEND_ID
            assert source[0]["metric"]["source_principal"] == CLIENT_ID

            async def median() -> float | None:
                got = await prom.value(
                    "histogram_quantile(0.5, sum(rate("
                    "istio_request_duration_milliseconds_bucket[1m])) by (le))"
                )
                return got if got is not None and math.isfinite(got) else None

            assert await eventually(median, timeout=30, what="a duration median") > 0

            # TCP: what the client sent arrived (received by the backend's sidecar) and came
            # back (sent by it, with the app's greeting line).
            tcp = 'reporter="destination",destination_app="backend",source_principal="{}"'
            received_q = f"sum(istio_tcp_received_bytes_total{{{tcp.format(CLIENT_ID)}}})"
            sent_q = f"sum(istio_tcp_sent_bytes_total{{{tcp.format(CLIENT_ID)}}})"

            async def within(promql: str, want: int) -> float | None:
                got = await prom.value(promql)
                return got if got is not None and abs(got - want) <= want * 0.01 else None

            await eventually(lambda: within(received_q, sent), timeout=60, what="TCP received")
            await eventually(
                lambda: within(sent_q, sent + len("backend\n")), timeout=30, what="TCP sent"
            )
            opened = await prom.value(
                f"sum(istio_tcp_connections_opened_total{{{tcp.format(CLIENT_ID)}}})"
            )
            assert opened == 1
            await eventually(
                lambda: count(
                    f"sum(istio_tcp_connections_closed_total{{{tcp.format(CLIENT_ID)}}})", 1
                ),
                timeout=30,
                what="TCP closed",
            )

            # The outside caller: plaintext, its claims ignored.
            outside_q = (
                f'sum(istio_requests_total{{{dest},source_workload="unknown",'
                f'connection_security_policy="none",source_principal="unknown"}})'
            )
            await eventually(lambda: count(outside_q, 5), timeout=30, what="outside calls")
            assert await prom.value('sum(istio_requests_total{source_workload="evil"})') is None
            assert await prom.value('sum(istio_requests_total{source_app="evil"})') is None
        finally:
            prom.stop()
            client.kill()
            backend.kill()
    await echo.close()
    await app.close()


def _xfcc(headers: dict[str, str]) -> str:
    return next((v for k, v in headers.items() if k.lower() == "x-forwarded-client-cert"), "")


async def _ok(call: object) -> bool:
    return await call == 200  # type: ignore[misc]
