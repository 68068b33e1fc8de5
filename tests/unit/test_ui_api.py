"""/ui/api/* over real HTTP (an aiohttp server on a loopback port): parameter checking (400
JSON errors for unknown, repeated or bad parameters), 404s, the graph, the details of a node
and an edge with the config that applies, the proxies rows with NACK text, the config view
with file:line errors, and the page's security headers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web

from control.config.errors import ConfigError
from control.config.loader import load_paths
from control.model.index import MeshIndex
from control.model.types import MeshConfig
from control.ui.dashboard import Dashboard, SourceError
from control.ui.promapi import PrometheusError
from control.ui.routes import UiRoutes
from control.ui.samples import Sample, Snapshot, TargetSamples, sample

HOSTILE = "<img src=x onerror=alert(1)>"
MESH = """\
apiVersion: v1
kind: Service
metadata: {name: backend, namespace: shop}
spec:
  selector: {app: backend}
  ports: [{name: http, port: 9080, targetPort: 8080}]
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: backend, namespace: shop}
spec: {address: 10.0.0.5, labels: {app: backend}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: backend-faults, namespace: shop}
spec:
  hosts: [backend]
  http:
  - fault: {abort: {percentage: {value: 50}, httpStatus: 503}}
    route: [{destination: {host: backend}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: backend, namespace: shop}
spec:
  host: backend
  trafficPolicy: {connectionPool: {tcp: {maxConnections: 10}}}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: shop}
spec: {mtls: {mode: STRICT}}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: backend-allow, namespace: shop}
spec:
  selector: {matchLabels: {app: backend}}
  rules: [{from: [{source: {principals: ["cluster.local/ns/shop/sa/client"]}}]}]
"""
BACKEND = "svc:backend.shop.svc.cluster.local"


def _requests(count: float, code: str = "200", src: str = "client") -> Sample:
    return sample(
        "istio_requests_total",
        {
            "reporter": "destination",
            "source_workload": src,
            "source_workload_namespace": "shop",
            "destination_workload": "backend",
            "destination_workload_namespace": "shop",
            "destination_service": "backend.shop.svc.cluster.local",
            "destination_service_name": "backend",
            "destination_service_namespace": "shop",
            "response_code": code,
            "connection_security_policy": "mutual_tls",
        },
        count,
    )


@dataclass
class FixedSource:
    """A metrics source with two snapshots set by the test (or an error)."""

    pair: tuple[Snapshot, Snapshot] | None
    error: str = ""
    name: str = "agents"
    asked: list[float] = field(default_factory=list)

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def window(self, seconds: float) -> tuple[Snapshot, Snapshot] | None:
        self.asked.append(seconds)
        if self.error:
            raise PrometheusError(self.error)
        return self.pair


@dataclass
class Config:
    current: MeshConfig
    errors: Mapping[str, ConfigError] = field(default_factory=dict)


def _syncz() -> list[dict[str, Any]]:
    lds = "type.googleapis.com/envoy.config.listener.v3.Listener"
    cds = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
    return [
        {
            "proxy": f"sidecar~10.0.0.9~{HOSTILE}.shop~shop.svc.cluster.local",
            "namespace": "shop",
            "stream": "s1",
            "istiod": "cp-1",
            "types": {
                cds: {"status": "SYNCED", "sent_version": "3", "last_nack": ""},
                lds: {
                    "status": "ERROR",
                    "sent_version": "4",
                    "last_nack": f"cannot bind 192.0.2.10:9080 {HOSTILE}",
                },
            },
        },
        {
            "proxy": "sidecar~10.0.0.8~web.front~front.svc.cluster.local",
            "namespace": "front",
            "stream": "s2",
            "istiod": "cp-1",
            "types": {cds: {"status": "SYNCED", "sent_version": "3", "last_nack": ""}},
        },
    ]


@pytest.fixture
async def server(tmp_path: Any) -> AsyncIterator[tuple[str, FixedSource]]:
    path = tmp_path / "mesh.yaml"
    path.write_text(MESH)
    config = load_paths([str(path)])
    bad = ConfigError(str(tmp_path / f"{HOSTILE}.yaml"), 7, "spec.ports[0].port: not a port")
    old = Snapshot(
        0.0,
        {
            "a": TargetSamples.of(
                0.0, (_requests(0), _requests(0, "503"), _requests(0, src=HOSTILE))
            )
        },
    )
    new = Snapshot(
        10.0,
        {
            "a": TargetSamples.of(
                10.0, (_requests(100), _requests(100, "503"), _requests(10, src=HOSTILE))
            )
        },
    )
    source = FixedSource((old, new))
    index = MeshIndex(config)
    dashboard = Dashboard(
        source,
        syncz=_syncz,
        config=Config(config, {bad.file: bad}),
        index=lambda: index,
    )
    ui = UiRoutes(dashboard)
    await ui.start()
    app = web.Application()
    ui.add_to(app.router)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", source
    finally:
        await runner.cleanup()
        await ui.close()


async def _get(url: str) -> tuple[int, Any, Mapping[str, str]]:
    async with aiohttp.ClientSession() as s, s.get(url, allow_redirects=False) as r:
        text = await r.text()
        try:
            body: Any = json.loads(text)
        except ValueError:
            body = text
        return r.status, body, r.headers


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/ui/api/graph?windw=5s", "unknown parameter 'windw' (allowed: namespace, window)"),
        ("/ui/api/graph?window=5s&window=10s", "parameter 'window' given more than once"),
        ("/ui/api/graph?window=soon", "parameter 'window': 'soon' is not a duration"),
        ("/ui/api/graph?window=2h", "parameter 'window': '2h' is outside 1s..1h"),
        ("/ui/api/proxies?verbose=1", "unknown parameter 'verbose' (allowed: namespace)"),
        ("/ui/api/config?ns=shop", "unknown parameter 'ns' (allowed: kind, namespace)"),
        ("/ui/api/node", "parameter 'id' is required"),
        ("/ui/api/edge?id=", "parameter 'id': must not be empty"),
        (f"/ui/api/node?id=x&{HOSTILE}=1", "unknown parameter"),
    ],
)
async def test_bad_parameters_are_400_json(
    server: tuple[str, FixedSource], path: str, message: str
) -> None:
    base, _ = server
    status, body, headers = await _get(base + path)
    assert status == 400
    assert headers["Content-Type"].startswith("application/json")
    assert message in body["error"] and body["status"] == 400


async def test_unknown_things_are_404(server: tuple[str, FixedSource]) -> None:
    base, _ = server
    status, body, _ = await _get(base + "/ui/api/nodes")
    assert status == 404 and "no API '/ui/api/nodes'" in body["error"]
    status, body, _ = await _get(base + "/ui/api/node?id=svc:nothing.shop.svc.cluster.local")
    assert status == 404 and "no service" in body["error"]
    status, body, _ = await _get(base + "/ui/api/edge?id=no-separator")
    assert status == 404 and "SOURCE>TARGET" in body["error"]
    status, _, _ = await _get(base + "/ui/static/secret.txt")
    assert status == 404
    status, _, headers = await _get(base + "/ui")
    assert status == 308 and headers["Location"] == "/ui/"


async def test_graph_json_and_window(server: tuple[str, FixedSource]) -> None:
    base, source = server
    status, body, headers = await _get(base + "/ui/api/graph?window=1m")
    assert status == 200 and source.asked[-1] == 60.0
    assert headers["Cache-Control"] == "no-store"
    assert body["source"] == "agents" and body["collecting"] is False
    edges = {e["id"]: e for e in body["edges"]}
    edge = edges[f"wl:shop/client>{BACKEND}"]
    assert edge["rps"] == 20.0 and edge["error_rate"] == 0.5 and edge["mtls"] is True
    # A hostile workload name is data in JSON; the page renders it as text.
    assert f"wl:shop/{HOSTILE}" in {n["id"] for n in body["nodes"]}
    status, body, _ = await _get(base + "/ui/api/graph?namespace=front")
    assert status == 200 and body["nodes"] == [] and body["edges"] == []


async def test_graph_before_two_snapshots_and_when_prometheus_fails(
    server: tuple[str, FixedSource],
) -> None:
    base, source = server
    source.pair = None
    status, body, _ = await _get(base + "/ui/api/graph")
    assert status == 200 and body["collecting"] is True and body["nodes"] == []
    source.error = "http://prom:9090: no answer within 5s"
    status, body, _ = await _get(base + "/ui/api/graph")
    assert status == 502 and "no answer within 5s" in body["error"]


async def test_service_node_detail_names_its_config(server: tuple[str, FixedSource]) -> None:
    base, _ = server
    status, body, _ = await _get(base + f"/ui/api/node?id={BACKEND}")
    assert status == 200, body
    config = body["config"]
    assert [v["name"] for v in config["virtual_services"]] == ["backend-faults"]
    assert config["virtual_services"][0]["line"] > 0
    assert config["virtual_services"][0]["spec"]["http"][0]["fault"]["abort"]["httpStatus"] == 503
    assert [r["name"] for r in config["destination_rules"]] == ["backend"]
    assert [w["name"] for w in config["workloads"]] == ["backend"]
    assert body["node"]["rps_in"] == 21.0


async def test_workload_and_edge_details_name_policies(server: tuple[str, FixedSource]) -> None:
    base, _ = server
    status, body, _ = await _get(base + "/ui/api/node?id=wl:shop/backend")
    assert status == 200, body
    assert body["config"]["mtls_mode"] == "STRICT"
    assert [p["name"] for p in body["config"]["peer_authentications"]] == ["default"]
    assert [p["name"] for p in body["config"]["authorization_policies"]] == ["backend-allow"]
    edge_id = f"wl:shop/client>{BACKEND}"
    status, body, _ = await _get(base + "/ui/api/edge?id=" + quote(edge_id))
    assert status == 200, body
    assert body["edge"]["error_rate"] == 0.5
    assert body["config"]["virtual_service"]["name"] == "backend-faults"
    assert body["config"]["destination_rule"]["name"] == "backend"
    status, body, _ = await _get(base + f"/ui/api/edge?id={BACKEND}>wl:shop/backend")
    assert status == 200 and body["config"]["server"]["strict"] is True


async def test_proxies_rows_with_nack_and_namespace_filter(
    server: tuple[str, FixedSource],
) -> None:
    base, _ = server
    status, body, _ = await _get(base + "/ui/api/proxies")
    assert status == 200
    assert body["namespaces"] == ["front", "shop"]
    row = next(p for p in body["proxies"] if p["namespace"] == "shop")
    assert row["name"] == f"{HOSTILE}.shop" and row["status"] == "ERROR"
    assert row["nacks"] == [{"type": "LDS", "message": f"cannot bind 192.0.2.10:9080 {HOSTILE}"}]
    assert row["config_dump"].startswith("/debug/config_dump?proxyID=sidecar~10.0.0.9~%3Cimg")
    status, body, _ = await _get(base + "/ui/api/proxies?namespace=front")
    assert [p["name"] for p in body["proxies"]] == ["web.front"]


async def test_config_objects_and_file_line_errors(server: tuple[str, FixedSource]) -> None:
    base, _ = server
    status, body, _ = await _get(base + "/ui/api/config")
    assert status == 200
    assert {o["kind"] for o in body["objects"]} >= {"Service", "VirtualService"}
    [error] = body["errors"]
    assert error["line"] == 7 and error["message"].endswith(
        f"{HOSTILE}.yaml:7: spec.ports[0].port: not a port"
    )
    status, body, _ = await _get(base + "/ui/api/config?kind=VirtualService,DestinationRule")
    assert sorted(o["kind"] for o in body["objects"]) == ["DestinationRule", "VirtualService"]


async def test_page_and_assets_carry_a_strict_content_security_policy(
    server: tuple[str, FixedSource],
) -> None:
    base, _ = server
    status, body, headers = await _get(base + "/ui/")
    assert status == 200 and '<script src="/ui/static/app.js"' in body
    csp = headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert headers["X-Content-Type-Options"] == "nosniff"
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        status, body, headers = await _get(base + "/ui/static/" + name)
        assert status == 200 and headers["Content-Type"].startswith(kind)
    # The page's own script never writes markup from data.
    status, script, _ = await _get(base + "/ui/static/app.js")
    status, graph, _ = await _get(base + "/ui/static/graph.js")
    for source in (script, graph):
        assert "innerHTML" not in source and "insertAdjacentHTML" not in source
        assert "document.write" not in source


async def test_newer_snapshots_are_built_once_while_the_last_graph_is_served() -> None:
    first = (
        Snapshot(0.0, {"a": TargetSamples.of(0.0, (_requests(0),))}),
        Snapshot(10.0, {"a": TargetSamples.of(10.0, (_requests(100),))}),
    )
    source = FixedSource(first)
    dashboard = Dashboard(source, syncz=list, config=Config(MeshConfig()), index=lambda: None)  # type: ignore[arg-type,return-value]
    answer = await dashboard.graph(5.0)
    assert answer.graph is not None and answer.graph.edges[0].rps == 10.0
    assert await dashboard.graph(5.0) is answer  # the same snapshots: the same answer
    source.pair = (first[1], Snapshot(20.0, {"a": TargetSamples.of(20.0, (_requests(400),))}))
    stale = await dashboard.graph(5.0)
    assert stale is answer  # the newer graph is being built; the last one is served
    fresh = await eventually_graph(dashboard, lambda a: a is not answer)
    assert fresh.graph is not None and fresh.graph.edges[0].rps == 30.0


async def eventually_graph(dashboard: Dashboard, ok: Any) -> Any:
    import asyncio

    for _ in range(200):
        answer = await dashboard.graph(5.0)
        if ok(answer):
            return answer
        await asyncio.sleep(0.01)
    raise AssertionError("the newer graph was never served")


async def test_prometheus_source_asks_the_window_ends_over_the_http_api() -> None:
    """--prometheus-url: the series' values at both ends of the window from /api/v1/query
    (an in-test server speaking Prometheus's API), the graph from them."""
    from control.ui.promapi import QUERY, PrometheusSource

    asked: list[tuple[str, float]] = []

    async def query(request: web.Request) -> web.Response:
        at = float(request.query["time"])
        asked.append((request.query["query"], at))
        labels = {k: v for k, v in _requests(0).labels}
        result = [
            {
                "metric": {
                    "__name__": "istio_requests_total",
                    "instance": "10.0.0.5:15020",
                    **labels,
                },
                "value": [at, str(12 * at)],  # 12 requests per second
            }
        ]
        return web.json_response(
            {"status": "success", "data": {"resultType": "vector", "result": result}}
        )

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    source = PrometheusSource(f"http://127.0.0.1:{port}/", clock=lambda: 1_700_000_000.0)
    await source.start()
    try:
        dashboard = Dashboard(source, syncz=list, config=Config(MeshConfig()), index=lambda: None)  # type: ignore[arg-type,return-value]
        answer = await dashboard.graph(60.0)
        assert answer.graph is not None
        [edge, _] = answer.graph.edges
        assert edge.rps == pytest.approx(12.0)
        assert sorted(at for _, at in asked) == [1_700_000_000.0 - 60, 1_700_000_000.0]
        assert all(q == QUERY for q, _ in asked)
        assert json.loads(answer.body)["source"] == "prometheus"
    finally:
        await source.close()
        await runner.cleanup()
    # A Prometheus that is not there: 502 with the reason, not a traceback.
    gone = PrometheusSource(f"http://127.0.0.1:{port}", timeout=1.0)
    await gone.start()
    try:
        dashboard = Dashboard(gone, syncz=list, config=Config(MeshConfig()), index=lambda: None)  # type: ignore[arg-type,return-value]
        with pytest.raises(SourceError, match=f"127.0.0.1:{port}"):
            await dashboard.graph(5.0)
    finally:
        await gone.close()


def test_ui_and_prometheus_flags() -> None:
    from control.__main__ import build_parser

    args = build_parser().parse_args([])
    assert (args.ui, args.prometheus_url) == ("on", "")
    args = build_parser().parse_args(["--ui", "off", "--prometheus-url", "http://prom:9090"])
    assert (args.ui, args.prometheus_url) == ("off", "http://prom:9090")
    for bad in (
        ["--ui", "maybe"],
        ["--prometheus-url", "prom:9090"],
        ["--prometheus-url", "http://p/?q=1"],
    ):
        with pytest.raises(SystemExit):
            build_parser().parse_args(bad)


def test_config_view_shows_computed_status_over_loaded_status(tmp_path: Any) -> None:
    from control.ui.configview import config_json

    path = tmp_path / "mesh.yaml"
    path.write_text(MESH)
    config = load_paths([str(path)])
    status = {"conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}]}
    out = config_json(
        config,
        {},
        statuses=[{"kind": "Service", "namespace": "shop", "name": "backend", "status": status}],
    )
    shown = {(o["kind"], o["name"]): o["status"] for o in out["objects"]}  # type: ignore[attr-defined]
    assert shown[("Service", "backend")] == status
    assert shown[("VirtualService", "backend-faults")] is None
