"""The dashboard against a real mesh, in real headless Chromium (issue 21's acceptance):
a proxy whose Envoy NACKed config shows Envoy's own message in the proxies table, and a
broken config file shows its `file:line` error in the config view; zero console errors;
screenshots in test-artifacts/ui-mesh/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.envoy.bootstrap import BootstrapOptions, build_bootstrap
from tests.support.browser import artifacts_dir, chromium
from tests.support.controlplane import eventually, running_control_plane
from tests.support.envoy import EnvoyProcess
from tests.support.mesh import UNBINDABLE_SIDECAR, WEB_YAML
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
