"""Telemetry at the mesh's edge, end to end: a real router (`pilotfish-agent --proxy-type
router`, its own Envoy) serving an Istio Gateway in front of a sidecar backend under mTLS
(the mesh of test_gateway_pods.py), with a Zipkin receiver (test_telemetry_tracing.py).

- A Telemetry selecting the router's workload sends its access log to a file provider of
  its own: one line per request through the gateway, and none from the backend.
- Standard metrics: the router's agent reports `reporter="source"` with the router as
  source workload and the backend (from its peer metadata) as destination; the backend's
  agent reports `reporter="destination"` with the router's workload (from the metadata
  header the router sent) and its SPIFFE ID (from the mTLS peer certificate).
- Tracing: each request is one trace, the router's span its root and the backend sidecar's
  SERVER span its child.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import aiohttp
import pytest

from tests.e2e.test_gateway_pods import mtls_mesh_yaml
from tests.e2e.test_telemetry_access_logs import text_entries
from tests.e2e.test_telemetry_tracing import Span, ZipkinReceiver, sampling
from tests.support.agentproc import AgentProcess
from tests.support.apps import EchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.envoyadmin import (
    draining,
    dynamic_listeners,
    file_loggers,
    metrics_loggers,
)
from tests.support.gateways import GATEWAY_NS, GATEWAY_SPIFFE, http_get, router_agent, router_ready
from tests.support.mesh import mesh_agent
from tests.support.net import pod_ip
from tests.support.promtext import Exposition, parse

pytestmark = pytest.mark.envoy

REQUESTS = 20
ROUTER_WORKLOAD = "ingress-0"  # the router pod's name (router_agent)
BACKEND_CLUSTER = "outbound|9080||backend.default.svc.cluster.local"


def mesh_config(zipkin: ZipkinReceiver, log: Path) -> str:
    return textwrap.dedent(
        f"""\
        extensionProviders:
        - name: zipkin
          zipkin: {{service: "{zipkin.host}", port: {zipkin.port}}}
        - name: gateway-log
          envoyFileAccessLog: {{path: "{log}"}}
        defaultProviders:
          tracing: [zipkin]
        """
    )


GATEWAY_LOGS = textwrap.dedent(
    f"""\
    apiVersion: telemetry.istio.io/v1
    kind: Telemetry
    metadata: {{name: gateway-logs, namespace: {GATEWAY_NS}}}
    spec:
      selector: {{matchLabels: {{istio: ingressgateway}}}}
      accessLogging:
      - providers: [{{name: gateway-log}}]
    """
)


async def metrics(ip: str) -> Exposition:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s,
        s.get(f"http://{ip}:15020/stats/prometheus") as r,
    ):
        assert r.status == 200
        return parse(await r.text())


def source_requests(e: Exposition) -> float:
    return e.total(
        "istio_requests_total",
        reporter="source",
        source_workload=ROUTER_WORKLOAD,
        source_workload_namespace=GATEWAY_NS,
        destination_workload="backend",
        destination_workload_namespace="default",
        response_code="200",
    )


def destination_requests(e: Exposition) -> float:
    return e.total(
        "istio_requests_total",
        reporter="destination",
        source_workload=ROUTER_WORKLOAD,
        source_workload_namespace=GATEWAY_NS,
        source_principal=GATEWAY_SPIFFE,
        destination_workload="backend",
        connection_security_policy="mutual_tls",
        response_code="200",
    )


async def router_settled(ip: str) -> bool:
    """The router's Envoy runs its listeners with the file logger, the tracer and the
    metrics logger, and nothing from before is draining."""
    dump = await dynamic_listeners(ip)
    if dump is None or await draining(ip) != 0:
        return False
    return file_loggers(dump) > 0 and metrics_loggers(dump) > 0 and "envoy.tracers.zipkin" in dump


def gateway_lines(log: Path) -> list[dict[str, str]]:
    if not log.exists():
        return []
    return [e for e in text_entries(log.read_text()) if e["path"].startswith("/edge/")]


async def test_gateway_logs_metrics_and_traces(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(mtls_mesh_yaml())
    (cfg / "telemetry.yaml").write_text(sampling(100) + "---\n" + GATEWAY_LOGS)
    log = tmp_path / "gateway.log"
    zipkin = ZipkinReceiver(pod_ip())
    await zipkin.start()
    mesh_file = tmp_path / "meshconfig.yaml"
    mesh_file.write_text(mesh_config(zipkin, log))
    backend_ip = pod_ip()
    app = EchoApp("backend", backend_ip, 8080)
    await app.start()
    agents: list[AgentProcess] = []
    try:
        async with running_control_plane(cfg, mesh_config=mesh_file) as cp:
            router = router_agent(cp, tmp_path)
            agents.append(router.agent)
            backend = mesh_agent(
                cp, tmp_path, backend_ip, "backend-0", "app=backend", group="backend"
            )
            agents.append(backend)
            backend.start()
            for ip, agent in ((router.ip, router.agent), (backend_ip, backend)):
                await eventually(lambda ip=ip, agent=agent: router_ready(ip, agent), timeout=60)
            await eventually(lambda: router_settled(router.ip), timeout=30, what="router config")

            async def through_gateway(path: str) -> int:
                status, _, _ = await http_get(router.ip, 8080, path, "backend.example.com")
                return status

            await eventually(
                lambda: _is_ok(through_gateway("/warmup")), timeout=30, what="gateway -> backend"
            )
            warmups = 1
            before_spans = {s.trace_id for s in zipkin.spans}

            # Each side names the other once its agent has the peer table with the other's
            # row (the router's arrives with the push its connection caused): until then
            # requests count as `unknown`, so the warm-up goes on until both name the other.
            async def named_both_ways() -> bool:
                nonlocal warmups
                assert await through_gateway("/warmup") == 200
                warmups += 1
                return await _counts(router.ip, backend_ip, 1) is not None

            await eventually(named_both_ways, timeout=30, what="the warm-up named")
            # Every warm-up OK is counted (named or not: the loggers flush every second)
            # before the baselines are read, so the baselines hold them all.
            source_before, dest_before = await eventually(
                lambda: _warmed(router.ip, backend_ip, warmups), timeout=30, what="warm-up counted"
            )
            for i in range(REQUESTS):
                assert await through_gateway(f"/edge/{i}") == 200

            # Access log: the router's file, one line per request, routed to the backend.
            lines = await eventually(
                lambda: _at_least(gateway_lines(log), REQUESTS),
                timeout=30,
                what="gateway access log lines",
            )
            assert sorted(e["path"] for e in lines) == sorted(f"/edge/{i}" for i in range(REQUESTS))
            assert {e["code"] for e in lines} == {"200"}
            assert {e["cluster"] for e in lines} == {BACKEND_CLUSTER}
            assert {e["authority"] for e in lines} == {"backend.example.com"}

            # Metrics: both reporters count every request, with the router as source.
            source, dest = await eventually(
                lambda: _counts(router.ip, backend_ip, 1 + REQUESTS),
                timeout=30,
                what="istio_requests_total",
            )
            assert (source - source_before, dest - dest_before) == (REQUESTS, REQUESTS)
            # The backend's own workload is not mistaken for the caller.
            backend_metrics = await metrics(backend_ip)
            assert (
                backend_metrics.total(
                    "istio_requests_total", reporter="destination", source_workload="unknown"
                )
                == 0
            )

            # Tracing: one trace per request, router span (root) -> backend SERVER span.
            traces = await eventually(
                lambda: _complete(zipkin.spans, before_spans), timeout=30, what="spans"
            )
            for trace_id in traces:
                check_trace(zipkin.spans, trace_id)
            # The access log file is the router's alone: the backend wrote none of it.
            assert len(gateway_lines(log)) == REQUESTS
    finally:
        for agent in agents:
            agent.kill()
        await app.close()
        await zipkin.close()


async def _counts(router_ip: str, backend_ip: str, n: int) -> tuple[float, float] | None:
    """(source-reported, destination-reported) gateway requests, once both reach `n`."""
    source = source_requests(await metrics(router_ip))
    dest = destination_requests(await metrics(backend_ip))
    return (source, dest) if source >= n and dest >= n else None


async def _warmed(router_ip: str, backend_ip: str, n: int) -> tuple[float, float] | None:
    """The named (source, destination) counts once each side counted `n` gateway OKs in all,
    named or `unknown`."""
    router, backend = await metrics(router_ip), await metrics(backend_ip)
    counted = (
        router.total(
            "istio_requests_total",
            reporter="source",
            source_workload=ROUTER_WORKLOAD,
            response_code="200",
        ),
        backend.total(
            "istio_requests_total",
            reporter="destination",
            source_principal=GATEWAY_SPIFFE,
            response_code="200",
        ),
    )
    if counted != (n, n):
        return None
    return source_requests(router), destination_requests(backend)


def _at_least(lines: list[dict[str, str]], n: int) -> list[dict[str, str]] | None:
    return lines if len(lines) >= n else None


async def _is_ok(pending: object) -> bool:
    return bool(await pending == 200)  # type: ignore[misc]


def _complete(spans: list[Span], before: set[str]) -> set[str] | None:
    edge = {s.trace_id for s in spans if "/edge/" in s.tags.get("http.url", "")}
    counts: dict[str, int] = {}
    for s in spans:
        if s.trace_id in edge and s.trace_id not in before:
            counts[s.trace_id] = counts.get(s.trace_id, 0) + 1
    done = {t for t, n in counts.items() if n >= 2}
    return done if len(done) >= REQUESTS else None


def check_trace(spans: list[Span], trace_id: str) -> None:
    trace = [s for s in spans if s.trace_id == trace_id]
    assert len(trace) == 2, json.dumps([s.__dict__ for s in trace], default=str)
    (root,) = [s for s in trace if not s.parent_id]
    assert root.kind == "CLIENT", root
    assert root.service.startswith(ROUTER_WORKLOAD), root
    assert root.tags.get("istio.namespace") == GATEWAY_NS
    (server,) = [s for s in trace if s.parent_id == root.span_id]
    assert server.kind == "SERVER" and server.service == "backend.default", server
