"""Tracing end to end: real Envoys in three pods report to receivers written here that speak
the real protocols: Zipkin (HTTP POST of JSON v2 spans to /api/v2/spans) and OpenTelemetry
(OTLP gRPC `TraceService/Export`).

A request enters the frontend's sidecar (inbound), reaches the frontend app, which calls the
backend through its own sidecar forwarding the trace headers (B3 for Zipkin, W3C
`traceparent` for OpenTelemetry, as an app must), and ends at the backend's sidecar. The
three spans share one trace id and link up: frontend SERVER (root) -> frontend CLIENT ->
backend SERVER. Sampling: 0 sends none, 100 all, 50 about half of 400 requests (Envoy's own
`tracing.random_sampling` counter agrees with what arrived).
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from control.app import ControlPlane
from tests.support.agentproc import AgentProcess
from tests.support.apps import EchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.envoyadmin import counter, draining, dynamic_listeners, status_of
from tests.support.grpcserver import start_generic_server
from tests.support.mesh import backend_yaml, mesh_agent
from tests.support.net import pod_ip

pytestmark = pytest.mark.envoy

TRACE_HEADERS = (
    "x-request-id",
    "x-b3-traceid",
    "x-b3-spanid",
    "x-b3-parentspanid",
    "x-b3-sampled",
    "x-b3-flags",
    "b3",
    "traceparent",
    "tracestate",
)


@dataclass(frozen=True)
class Span:
    trace_id: str
    span_id: str
    parent_id: str
    kind: str  # CLIENT | SERVER
    service: str
    tags: dict[str, str] = field(default_factory=dict, compare=False)


class ZipkinReceiver:
    """POST /api/v2/spans with a JSON list of Zipkin v2 spans (what Envoy's Zipkin tracer
    sends with collector_endpoint_version HTTP_JSON)."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.port = 0
        self.spans: list[Span] = []
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/api/v2/spans", self._spans)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _spans(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/json"
        for s in await request.json():
            self.spans.append(
                Span(
                    s["traceId"],
                    s["id"],
                    s.get("parentId", ""),
                    s.get("kind", ""),
                    (s.get("localEndpoint") or {}).get("serviceName", ""),
                    dict(s.get("tags") or {}),
                )
            )
        return web.Response(status=202)


class OtlpReceiver:
    """opentelemetry.proto.collector.trace.v1.TraceService/Export over gRPC. The messages
    come with xds-protos (a dependency already; the `opentelemetry-proto` package would
    install the same module names over them); the service has one method, registered here
    by hand."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.port = 0
        self.spans: list[Span] = []
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        handler = grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.trace.v1.TraceService",
            {
                "Export": grpc.unary_unary_rpc_method_handler(
                    self._export,
                    request_deserializer=ExportTraceServiceRequest.FromString,
                    response_serializer=ExportTraceServiceResponse.SerializeToString,
                )
            },
        )
        self._server, self.port = await start_generic_server(self.host, handler)

    async def close(self) -> None:
        if self._server is not None:
            await self._server.stop(0)

    async def _export(
        self, request: ExportTraceServiceRequest, context: Any
    ) -> ExportTraceServiceResponse:
        kinds = {2: "SERVER", 3: "CLIENT"}
        for rs in request.resource_spans:
            attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
            # xds-protos bundles an OTLP version that still names field 2 of ResourceSpans
            # `instrumentation_library_spans`; it has ScopeSpans' wire shape.
            for ss in rs.instrumentation_library_spans:
                for s in ss.spans:
                    self.spans.append(
                        Span(
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            kinds.get(s.kind, str(s.kind)),
                            attrs.get("service.name", ""),
                            {a.key: a.value.string_value for a in s.attributes},
                        )
                    )
        return ExportTraceServiceResponse()


class ForwardingApp:
    """The frontend app: answers by calling the backend through its own sidecar, passing on
    the trace headers its sidecar gave it (what Istio asks of every app)."""

    def __init__(self, host: str, port: int, backend_url: str) -> None:
        self.host, self.port, self.backend_url = host, port, backend_url
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port, reuse_address=True).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        headers = {h: request.headers[h] for h in TRACE_HEADERS if h in request.headers}
        headers["Host"] = "backend"
        async with (
            aiohttp.ClientSession() as s,
            s.get(self.backend_url + request.path, headers=headers) as r,
        ):
            return web.Response(status=r.status, text=await r.text())


def mesh_yaml(zipkin: ZipkinReceiver, otlp: OtlpReceiver, default: str = "zipkin") -> str:
    return textwrap.dedent(
        f"""\
        extensionProviders:
        - name: zipkin
          zipkin: {{service: "{zipkin.host}", port: {zipkin.port}}}
        - name: otel
          opentelemetry: {{service: "{otlp.host}", port: {otlp.port}}}
        defaultProviders:
          tracing: [{default}]
        """
    )


def sampling(percent: float) -> str:
    """The mesh-wide Telemetry: the default tracing provider, at `percent`."""
    return textwrap.dedent(
        f"""\
        apiVersion: telemetry.istio.io/v1
        kind: Telemetry
        metadata: {{name: mesh-default, namespace: istio-system}}
        spec:
          tracing:
          - randomSamplingPercentage: {percent}
            customTags:
              team: {{literal: {{value: checkout}}}}
        """
    )


def write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


@dataclass
class Mesh:
    cp: ControlPlane
    cfg: Path
    mesh_file: Path
    frontend_ip: str
    backend_ip: str
    zipkin: ZipkinReceiver
    otlp: OtlpReceiver
    agents: list[AgentProcess]


@asynccontextmanager
async def traced_mesh(
    tmp_path: Path, telemetry: str, provider: str = "zipkin"
) -> AsyncIterator[Mesh]:
    frontend_ip, backend_ip, receivers_ip = pod_ip(), pod_ip(), pod_ip()
    zipkin, otlp = ZipkinReceiver(receivers_ip), OtlpReceiver(receivers_ip)
    await zipkin.start()
    await otlp.start()
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "apps.yaml").write_text(
        backend_yaml() + "---\n" + backend_yaml("frontend", port=9081, app_port=8081)
    )
    (cfg / "telemetry.yaml").write_text(telemetry)
    mesh_file = tmp_path / "meshconfig.yaml"
    mesh_file.write_text(mesh_yaml(zipkin, otlp, provider))
    backend_app = EchoApp("backend", backend_ip, 8080)
    frontend_app = ForwardingApp(frontend_ip, 8081, f"http://{frontend_ip}:9080")
    await backend_app.start()
    await frontend_app.start()
    agents: list[AgentProcess] = []
    try:
        async with running_control_plane(cfg, mesh_config=mesh_file) as cp:
            agents = [
                mesh_agent(cp, tmp_path, backend_ip, "backend", "app=backend", group="backend"),
                mesh_agent(cp, tmp_path, frontend_ip, "frontend", "app=frontend", group="frontend"),
            ]
            for a in agents:
                a.start()
            mesh = Mesh(cp, cfg, mesh_file, frontend_ip, backend_ip, zipkin, otlp, agents)
            await eventually(
                lambda: _ok(get(f"http://{frontend_ip}:9081/warmup", "frontend")),
                timeout=40,
                what="frontend -> backend",
            )
            try:
                yield mesh
            finally:
                for a in agents:
                    a.kill()
    finally:
        await frontend_app.close()
        await backend_app.close()
        await zipkin.close()
        await otlp.close()


async def get(url: str, host: str, session: aiohttp.ClientSession | None = None) -> int:
    return await status_of(url, host, session)


async def _ok(call: Any) -> bool:
    return bool(await call == 200)


async def settled(ip: str, tracer: str, percent: float | None = None) -> bool:
    """Every HCM of the pod's Envoy runs `tracer` (at `percent`, when given), and nothing from
    before is draining."""
    dump = await dynamic_listeners(ip)
    if dump is None or await draining(ip) != 0:
        return False
    tracings = list(_values(json.loads(dump), "tracing"))
    if not tracings:
        return False
    for t in tracings:
        if t.get("provider", {}).get("name") != tracer:
            return False
        if percent is not None and t.get("random_sampling", {}).get("value", 0) != percent:
            return False
    return True


def _values(node: Any, key: str) -> Any:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            else:
                yield from _values(v, key)
    elif isinstance(node, list):
        for item in node:
            yield from _values(item, key)


def check_trace(spans: list[Span], trace_id: str) -> None:
    """frontend SERVER (root) -> frontend CLIENT -> backend SERVER."""
    trace = [s for s in spans if s.trace_id == trace_id]
    assert len(trace) == 3, trace
    by_id = {s.span_id: s for s in trace}
    (root,) = [s for s in trace if not s.parent_id]
    assert root.kind == "SERVER" and root.service.startswith("frontend")
    (client,) = [s for s in trace if s.parent_id == root.span_id]
    assert client.kind == "CLIENT" and client.service.startswith("frontend")
    (server,) = [s for s in trace if s.parent_id == client.span_id]
    assert server.kind == "SERVER" and server.service.startswith("backend")
    assert set(by_id) == {root.span_id, client.span_id, server.span_id}
    assert root.tags.get("team") == "checkout"
    # Istio's own tags on every span.
    assert root.tags.get("istio.canonical_service") == "frontend"
    assert server.tags.get("istio.canonical_service") == "backend"
    assert server.tags.get("istio.namespace") == "default"


@pytest.mark.parametrize("provider", ["zipkin", "otel"])
async def test_one_trace_across_three_spans(tmp_path: Path, provider: str) -> None:
    async with traced_mesh(tmp_path, sampling(100), provider) as mesh:
        receiver = mesh.zipkin if provider == "zipkin" else mesh.otlp
        tracer = "envoy.tracers.zipkin" if provider == "zipkin" else "envoy.tracers.opentelemetry"
        for ip in (mesh.frontend_ip, mesh.backend_ip):
            await eventually(lambda ip=ip: settled(ip, tracer), timeout=30, what="tracer")
        before = {s.trace_id for s in receiver.spans}
        for i in range(3):
            assert await get(f"http://{mesh.frontend_ip}:9081/traced/{i}", "frontend") == 200
        # Three new traces of three spans each (the reporters flush every few seconds).
        traces = await eventually(
            lambda: _complete_traces(receiver.spans, before, 3), timeout=30, what="spans"
        )
        for trace_id in traces:
            check_trace(receiver.spans, trace_id)


def _complete_traces(spans: list[Span], before: set[str], want: int) -> set[str] | None:
    counts: dict[str, int] = {}
    for s in spans:
        if s.trace_id not in before:
            counts[s.trace_id] = counts.get(s.trace_id, 0) + 1
    done = {t for t, n in counts.items() if n >= 3}
    return done if len(done) >= want else None


async def test_sampling_0_100_and_50_percent(tmp_path: Path) -> None:
    async with traced_mesh(tmp_path, sampling(0)) as mesh:
        frontend = f"http://{mesh.frontend_ip}:9081"
        # The frontend's inbound HCM decides (its outbound one keeps that decision).
        stat = r"^http\.inbound_.*\.tracing\.random_sampling$"

        async def burst(n: int, tag: str) -> None:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
                for i in range(0, n, 20):
                    codes = await asyncio.gather(
                        *(get(f"{frontend}/{tag}/{j}", "frontend", s) for j in range(i, i + 20))
                    )
                    assert codes == [200] * 20

        async def roots() -> int:
            # Traces are decided where they start: the frontend's inbound SERVER spans.
            return len({s.trace_id for s in mesh.zipkin.spans if not s.parent_id})

        # 0%: Envoy samples none of 400 requests, and no span arrives.
        zipkin = "envoy.tracers.zipkin"
        await eventually(lambda: settled(mesh.frontend_ip, zipkin, 0), timeout=30)
        base = await counter(mesh.frontend_ip, stat)
        await burst(400, "zero")
        assert await counter(mesh.frontend_ip, stat) == base
        # 100%: every request is a trace (and, since the zipkin reporter sends in order, the
        # 0% ones would have arrived before these).
        write(mesh.cfg / "telemetry.yaml", sampling(100))
        await eventually(lambda: settled(mesh.frontend_ip, zipkin, 100), timeout=30)
        base = await counter(mesh.frontend_ip, stat)
        await burst(400, "all")
        assert await counter(mesh.frontend_ip, stat) - base == 400
        await eventually(lambda: _roots_at_least(mesh, 400), timeout=60, what="400 traces")
        assert await roots() == 400
        assert not [s for s in mesh.zipkin.spans if "/zero/" in s.tags.get("http.url", "")]
        # 50%: half of 400, give or take 10% of them.
        write(mesh.cfg / "telemetry.yaml", sampling(50))
        await eventually(lambda: settled(mesh.frontend_ip, zipkin, 50), timeout=30)
        base = await counter(mesh.frontend_ip, stat)
        await burst(400, "half")
        sampled = await counter(mesh.frontend_ip, stat) - base
        assert 160 <= sampled <= 240, sampled
        await eventually(lambda: _roots_at_least(mesh, 400 + sampled), timeout=60, what="traces")
        half = {s.trace_id for s in mesh.zipkin.spans if "/half/" in s.tags.get("http.url", "")}
        assert len(half) == sampled


async def _roots_at_least(mesh: Mesh, n: int) -> bool:
    return len({s.trace_id for s in mesh.zipkin.spans if not s.parent_id}) >= n
