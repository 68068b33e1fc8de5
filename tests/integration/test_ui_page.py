"""The dashboard page in real headless Chromium (DevTools protocol): it draws the graph from
metrics scraped off a connected proxy's status port, opens a node's and an edge's details
on a mouse click, lists the proxies and shows a rejected file's `file:line` error — and every
user-controlled string (a workload name from metrics labels, a pod name from a node id, a
file name in an error) arrives as text, never as markup, with zero console errors.
Screenshots of each view go to test-artifacts/ui-page/.

The status port here is a stand-in serving Istio's standard metrics with counters that rise
with time, so that the names in them can be hostile; the scrape, the graph, the API and the
page are the real ones. tests/e2e/test_ui_mesh.py drives the page against real agents, Envoy
and traffic.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest

from control.app import ControlPlane, ControlPlaneOptions
from protos import typeurls
from tests.support import gatewayapi as gwapi
from tests.support.adsclient import AdsStream, node_id
from tests.support.browser import Page, artifacts_dir, chromium
from tests.support.controlplane import bounded_teardown, eventually, running_control_plane
from tests.support.net import pod_ip
from tests.support.statusport import HOSTILE, StatusPort

MESH = """\
apiVersion: v1
kind: Service
metadata: {name: backend, namespace: default}
spec:
  selector: {app: backend}
  ports: [{name: http, port: 9080, targetPort: 8080}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: backend-route, namespace: default}
spec:
  hosts: [backend]
  http: [{route: [{destination: {host: backend}}]}]
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: istio-system}
spec: {mtls: {mode: STRICT}}
"""
BROKEN = """\
apiVersion: v1
kind: Service
metadata: {name: x, namespace: default}
spec:
  ports: [{port: nope}]
"""
CLIENT_EDGE = "wl:default/client>svc:backend.default.svc.cluster.local"


@pytest.fixture
async def status_port() -> AsyncIterator[StatusPort]:
    port = StatusPort(pod_ip())
    await port.start()
    try:
        yield port
    finally:
        await port.close()


async def _text_everywhere(page: Page, needle: str, selector: str) -> bool:
    return bool(
        await page.evaluate(
            f"[...document.querySelectorAll({json.dumps(selector)})]"
            f".some(e => e.textContent.includes({json.dumps(needle)}))"
        )
    )


async def _no_markup_from_data(page: Page) -> None:
    assert await page.evaluate("document.querySelectorAll('img').length") == 0
    assert await page.evaluate("window.__pwned === undefined")


async def test_dashboard_views_in_chromium_escape_hostile_strings(
    tmp_path: Path, status_port: StatusPort
) -> None:
    shots = artifacts_dir("ui-page")
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    # Gateway API objects: the status the control plane computes shows in the config view.
    (cfg / "gateway-api.yaml").write_text(
        gwapi.dump(
            gwapi.gateway_class(),
            gwapi.gateway(),
            gwapi.service("v1"),
            gwapi.route("web"),
        )
    )
    async with running_control_plane(cfg) as cp:
        # A connected proxy at the status port's IP, its pod name hostile (node ids are
        # the caller's claim, shown in the proxies table).
        async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as channel:
            stream = AdsStream(channel)
            request = DiscoveryRequest(type_url=typeurls.CLUSTER)
            request.node.id = node_id(status_port.ip, HOSTILE)
            request.node.metadata.update({"AUTO_REGISTER": "false"})
            await stream.send(request)
            await stream.recv()
            base = f"http://127.0.0.1:{cp.http_port}/ui/"
            async with chromium() as browser:
                page = await browser.new_page()
                await page.goto(base)
                # Two scrapes make the first rates; the page polls every 2 s.
                await page.wait_for(
                    f"!!document.querySelector('[data-id={json.dumps(CLIENT_EDGE)}]')", 30
                )
                assert status_port.scrapes >= 2
                edge = f"document.querySelector('[data-id={json.dumps(CLIENT_EDGE)}]')"
                await page.wait_for(f"Number({edge}.dataset.rps) > 0")
                rps = float(await page.evaluate(f"{edge}.dataset.rps"))
                assert 10 < rps < 30, rps
                error_rate = float(await page.evaluate(f"{edge}.dataset.errorRate"))
                assert 0.15 < error_rate < 0.35, error_rate
                assert await page.evaluate(f"{edge}.classList.contains('bad')")  # >= 20%
                assert (
                    await page.evaluate(
                        f"getComputedStyle({edge}.querySelector('.edge-lock')).display"
                    )
                    != "none"
                )
                assert await _text_everywhere(page, HOSTILE, "#graph .node title")
                await _no_markup_from_data(page)
                await page.screenshot(shots / "graph.png")

                # A click on the edge: its numbers and the VirtualService that applies.
                await page.click(f"[data-id={json.dumps(CLIENT_EDGE)}] path.hit")
                await page.wait_for(
                    "document.querySelector('#details-body')?.textContent.includes('backend-route')"
                )
                assert await _text_everywhere(page, "error rate (5xx)", "#details-body dt")
                await page.screenshot(shots / "graph-edge.png")
                # A click on the hostile node: its name as the panel's title, as text.
                hostile_node = json.dumps(f"wl:default/{HOSTILE}")
                await page.click(f"[data-id={hostile_node}] circle")
                await page.wait_for(
                    f"document.querySelector('#details-title').textContent.includes({json.dumps(HOSTILE)})"
                )
                await _no_markup_from_data(page)
                await page.screenshot(shots / "graph-node.png")

                await page.click('button[data-view="proxies"]')
                cells = "[...document.querySelectorAll('#proxies td')]"
                name = json.dumps(HOSTILE + ".default")
                await page.wait_for(f"{cells}.some(td => td.textContent === {name})")
                link = await page.evaluate(
                    "document.querySelector('#proxies a').getAttribute('href')"
                )
                assert link.startswith("/debug/config_dump?proxyID=sidecar~")
                await _no_markup_from_data(page)
                await page.screenshot(shots / "proxies.png")

                # A rejected file whose very name is hostile: its file:line error as text.
                bad = cfg / f"{HOSTILE}.yaml"
                bad.write_text(BROKEN)
                await eventually(lambda: str(bad) in cp.watcher.errors, what="file rejected")
                await page.click('button[data-view="config"]')
                errors = "[...document.querySelectorAll('.config-error')]"
                where = json.dumps(f"{bad}:5: ")
                await page.wait_for(f"{errors}.some(e => e.textContent.startsWith({where}))")
                assert await _text_everywhere(page, "backend-route", "#config td")
                route = "[...document.querySelectorAll('#config tbody tr')].find(r =>"
                route += " r.cells[0].textContent === 'HTTPRoute')"
                status = await page.wait_for(f"{route}?.cells[5].textContent")
                assert "Accepted=True" in status and "ResolvedRefs=True" in status, status
                gateway_class = route.replace("HTTPRoute", "GatewayClass")
                status = await page.evaluate(f"{gateway_class}?.cells[5].textContent")
                assert "Accepted=True" in status, status
                await page.click("#config tbody tr")
                await page.wait_for("!document.querySelector('#config-spec').hidden")
                await _no_markup_from_data(page)
                await page.screenshot(shots / "config.png")
                assert page.errors == [], page.errors
            await stream.close()


async def test_ui_off_serves_nothing_under_ui() -> None:
    cp = ControlPlane(
        ControlPlaneOptions(xds_address="127.0.0.1:0", http_address="127.0.0.1:0", ui=False)
    )
    await cp.start()
    try:
        assert cp.ui is None
        base = f"http://127.0.0.1:{cp.http_port}"
        async with aiohttp.ClientSession() as session:
            for path in ("/ui/", "/ui/api/graph", "/ui/static/app.js"):
                async with session.get(base + path) as r:
                    assert r.status == 404, path
            async with session.get(base + "/debug/syncz") as r:
                assert r.status == 200
    finally:
        await bounded_teardown(cp.close(0.2), "control plane close")
