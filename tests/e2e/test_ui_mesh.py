"""The dashboard against a real mesh, in real headless Chromium (issue 21's acceptance):

- two pods (agent + Envoy + app each) under STRICT mTLS with traffic between them: the graph
  shows the client → backend edge with a non-zero rate and the lock, from the standard
  metrics the control plane scrapes off the agents' status ports; a VirtualService injecting
  a 50% fault turns the edge's error rate to 50% ±10% on the page within 10 s;
- a proxy whose Envoy NACKed config shows Envoy's own message in the proxies table, and a
  broken config file shows its `file:line` error in the config view;

each with zero console errors and screenshots in test-artifacts/ui-mesh/."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import aiohttp
import pytest

from agent.envoy.bootstrap import BootstrapOptions, build_bootstrap
from tests.support.apps import EchoApp
from tests.support.browser import artifacts_dir, chromium
from tests.support.controlplane import eventually, running_control_plane
from tests.support.envoy import EnvoyProcess
from tests.support.mesh import UNBINDABLE_SIDECAR, WEB_YAML, backend_yaml, mesh_agent
from tests.support.net import pod_ip

pytestmark = pytest.mark.envoy

BROKEN = """\
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: web, namespace: default}
spec:
  hosts: [web]
  http: [{route: [{destination: {host: web, port: {number: many}}}]}]
"""


async def test_nack_and_broken_file_on_the_page(tmp_path: Path) -> None:
    shots = artifacts_dir("ui-mesh")
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(WEB_YAML.format(web_ip=pod_ip()))
    client_ip = pod_ip()
    async with running_control_plane(cfg) as cp:
        envoy = EnvoyProcess(
            build_bootstrap(
                BootstrapOptions(
                    ip=client_ip, pod_name="client", xds_address=f"127.0.0.1:{cp.xds_port}"
                )
            ),
            tmp_path / "envoy",
        )
        envoy.start()
        try:
            base = f"http://127.0.0.1:{cp.http_port}/ui/#proxies"
            async with chromium() as browser:
                page = await browser.new_page()
                await page.goto(base)
                row = "document.querySelector('#proxies tbody tr')"
                await page.wait_for(
                    f"!!{row} && [...{row}.cells].some(c => c.textContent === 'SYNCED')", 30
                )
                await page.screenshot(shots / "proxies-synced.png")

                (cfg / "sidecar.yaml").write_text(UNBINDABLE_SIDECAR)
                nack = await page.wait_for(
                    "[...document.querySelectorAll('#proxies td.nack')]"
                    ".map(td => td.textContent).find(t => t.includes('192.0.2.10'))",
                    30,
                )
                # Envoy's own words, as syncz recorded them.
                recorded = next(
                    row["types"]
                    for row in cp.views.syncz()
                    if row["proxy"].startswith(f"sidecar~{client_ip}~")
                )
                lds = next(v for t, v in recorded.items() if t.endswith("Listener"))
                assert nack == f"LDS: {lds['last_nack']}"
                assert await page.evaluate(
                    "[...document.querySelectorAll('#proxies td.state-ERROR')]"
                    ".some(td => td.textContent === 'ERROR')"
                )
                await page.screenshot(shots / "proxies-nack.png")

                bad = cfg / "web-routes.yaml"
                bad.write_text(BROKEN)
                await eventually(lambda: str(bad) in cp.watcher.errors, what="file rejected")
                await page.click('button[data-view="config"]')
                error = await page.wait_for(
                    "[...document.querySelectorAll('.config-error')].map(e => e.textContent)"
                    f".find(t => t.startsWith({json.dumps(str(bad) + ':')}))",
                    20,
                )
                assert error == str(cp.watcher.errors[str(bad)])
                line = error[len(str(bad)) + 1 :].split(":")[0]
                assert line.isdigit() and int(line) >= 1, error
                await page.screenshot(shots / "config-error.png")
                assert page.errors == [], page.errors
        finally:
            envoy.stop()


# --- with real traffic (needs the agents' standard metrics) -------------------------------

STRICT = """\
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: istio-system}
spec: {mtls: {mode: STRICT}}
"""
FAULT = """\
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: backend-fault, namespace: default}
spec:
  hosts: [backend]
  http:
  - fault: {abort: {percentage: {value: 50}, httpStatus: 503}}
    route: [{destination: {host: backend}}]
"""
TO_BACKEND = "svc:backend.default.svc.cluster.local"


class Load:
    """Requests client app → its Envoy → backend at about `rate` per second, until stopped
    (bounded: at most `limit` requests)."""

    def __init__(self, url: str, rate: float = 40.0, limit: int = 20_000) -> None:
        self.url, self.rate, self.limit = url, rate, limit
        self.codes: dict[int, int] = {}
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s:
            for _ in range(self.limit):
                try:
                    async with s.get(self.url, headers={"Host": "backend"}) as r:
                        await r.read()
                        self.codes[r.status] = self.codes.get(r.status, 0) + 1
                except (aiohttp.ClientError, TimeoutError):
                    self.codes[0] = self.codes.get(0, 0) + 1
                await asyncio.sleep(1 / self.rate)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def test_traffic_edge_mtls_and_fault_on_the_page(tmp_path: Path) -> None:
    shots = artifacts_dir("ui-mesh")
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(backend_yaml() + STRICT)
    client_ip, backend_ip = pod_ip(), pod_ip()
    app = EchoApp("backend", backend_ip, 8080)
    await app.start()
    async with running_control_plane(cfg) as cp:
        backend = mesh_agent(cp, tmp_path, backend_ip, "backend", "app=backend", group="backend")
        client = mesh_agent(cp, tmp_path, client_ip, "client", "app=client")
        backend.start()
        client.start()
        load = Load(f"http://{client_ip}:9080/")
        try:
            await eventually(
                lambda: _ok(f"http://{client_ip}:9080/"), timeout=40, what="client -> backend"
            )
            load.start()
            async with chromium() as browser:
                page = await browser.new_page()
                await page.goto(f"http://127.0.0.1:{cp.http_port}/ui/")
                # The caller's edge into the backend Service (whatever name the caller's
                # workload has in the metrics), with traffic and the lock.
                find = (
                    "[...document.querySelectorAll('#graph .edge')].find(e =>"
                    f" e.dataset.id.endsWith('>{TO_BACKEND}') && Number(e.dataset.rps) > 0)"
                )
                edge_id = await page.wait_for(f"{find}?.dataset.id", 40)
                assert edge_id.startswith("wl:default/"), edge_id
                edge = f"document.querySelector('[data-id={json.dumps(edge_id)}]')"
                assert await page.wait_for(f"{edge}.dataset.mtls === 'true'", 20)
                lock = f"getComputedStyle({edge}.querySelector('.edge-lock')).display"
                assert await page.evaluate(lock) != "none"
                assert float(await page.evaluate(f"{edge}.dataset.errorRate || 0")) < 0.05
                await page.screenshot(shots / "graph-traffic.png")

                (cfg / "fault.yaml").write_text(FAULT)
                # Within 10 s of the file: the edge on the page at 50% ±10% errors.
                rate = await page.wait_for(
                    f"(r => r >= 0.4 && r <= 0.6 && r)(Number({edge}.dataset.errorRate))",
                    timeout=10,
                    interval=0.2,
                )
                assert 0.4 <= rate <= 0.6
                await page.click(f"[data-id={json.dumps(edge_id)}] path.hit")
                await page.wait_for(
                    "document.querySelector('#details-body')?.textContent.includes('backend-fault')"
                )
                await page.screenshot(shots / "graph-fault.png")
                assert page.errors == [], page.errors
            assert load.codes.get(503, 0) > 0 and load.codes.get(200, 0) > 0, load.codes
        finally:
            await load.stop()
            client.kill()
            backend.kill()
    await app.close()


async def _ok(url: str) -> bool:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s,
            s.get(url, headers={"Host": "backend"}) as r,
        ):
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False
