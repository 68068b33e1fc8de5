"""syncz with a real Envoy (SYNCED, then ERROR after a config it rejects), the debug HTTP
endpoints, syncz over xDS, and bad YAML that keeps the last good config serving traffic."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import aiohttp
import grpc
import pytest
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest
from envoy.service.status.v3.csds_pb2 import ClientConfig

from agent.envoy.bootstrap import BootstrapOptions, build_bootstrap
from control.app import ControlPlane
from protos import typeurls
from tests.support.adsclient import AdsStream
from tests.support.apps import EchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.envoy import EnvoyProcess
from tests.support.mesh import UNBINDABLE_SIDECAR
from tests.support.mesh import WEB_YAML as BASE
from tests.support.net import pod_ip
from tests.support.promtext import parse

pytestmark = pytest.mark.envoy


async def http_get(url: str, host: str | None = None) -> tuple[int, str]:
    headers = {"Host": host} if host else {}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s,
            s.get(url, headers=headers) as r,
        ):
            return r.status, await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return 0, ""


def syncz_statuses(cp: ControlPlane) -> dict[str, str]:
    rows = cp.views.syncz()
    if not rows:
        return {}
    return {typeurls.SHORT_NAMES[t]: v["status"] for t, v in rows[0]["types"].items()}


async def test_syncz_synced_then_error_after_nack_and_bad_yaml_keeps_serving(
    tmp_path: Path,
) -> None:
    web_ip, client_ip = pod_ip(), pod_ip()
    app = EchoApp("web", web_ip, 8080)
    await app.start()
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(BASE.format(web_ip=web_ip))
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
            url = f"http://{client_ip}:9080/"
            await eventually(
                lambda: _is200(http_get(url, "web")), timeout=20, what="traffic via envoy"
            )
            want = {"CDS": "SYNCED", "EDS": "SYNCED", "LDS": "SYNCED", "RDS": "SYNCED"}
            await eventually(lambda: syncz_statuses(cp) == want, what="all SYNCED")

            # The same view over HTTP.
            base = f"http://127.0.0.1:{cp.http_port}"
            status, body = await http_get(base + "/debug/syncz")
            assert status == 200
            entry = json.loads(body)[0]
            assert entry["proxy"] == f"sidecar~{client_ip}~client.default~default.svc.cluster.local"
            assert entry["istiod"] == "test-cp"

            # Broken YAML: one clear error with file and line; the old config keeps serving.
            bad = cfg / "mesh.yaml"
            bad.write_text(BASE.format(web_ip=web_ip) + "---\nkind: Service\n  oops: [\n")
            await eventually(lambda: str(bad) in cp.watcher.errors, what="error recorded")
            err = str(cp.watcher.errors[str(bad)])
            assert err.startswith(f"{bad}:") and err.split(":")[1].isdigit(), err
            status, body = await http_get(base + "/debug/configz")
            assert str(bad) in json.loads(body)["errors"]
            for _ in range(5):
                assert (await http_get(url, "web"))[0] == 200
            bad.write_text(BASE.format(web_ip=web_ip))
            await eventually(lambda: not cp.watcher.errors, what="error cleared")

            # A config Envoy rejects: syncz shows ERROR with Envoy's message. (Envoy applies the
            # rest of a listener update, so the old listener is gone until the config is fixed.)
            (cfg / "sidecar.yaml").write_text(UNBINDABLE_SIDECAR)
            await eventually(lambda: syncz_statuses(cp).get("LDS") == "ERROR", what="LDS ERROR")
            nack = cp.views.syncz()[0]["types"][typeurls.LISTENER]["last_nack"]
            assert "192.0.2.10" in nack, nack
            # Fixing the config clears the error and brings the listener back.
            (cfg / "sidecar.yaml").unlink()
            await eventually(lambda: syncz_statuses(cp).get("LDS") == "SYNCED", what="LDS fixed")
            await eventually(lambda: _is200(http_get(url, "web")), what="traffic after fix")

            # Debug endpoints answer with real content.
            status, body = await http_get(base + "/ready")
            assert status == 200
            status, body = await http_get(base + "/metrics")
            assert status == 200 and "\npilot_xds_pushes{" in body
            assert 'pilot_total_xds_rejects{type="lds"}' in body
            # Istio's per-node gauge too, with the code Envoy NACKed with.
            nacked = parse(body).series("pilot_xds_lds_reject")
            assert [r["node"] for r in nacked] == [entry["proxy"]] and nacked[0]["err"], nacked
            status, body = await http_get(base + "/debug/connections")
            assert json.loads(body)[0]["ip"] == client_ip
            status, body = await http_get(base + "/debug/config_dump?proxyID=client.default")
            dump = json.loads(body)
            names = [c["name"] for c in dump["resources"]["CDS"]]
            assert "outbound|9080||web.default.svc.cluster.local" in names
            listener = dump["resources"]["LDS"][0]["resource"]
            assert listener["address"]["socketAddress"]["address"] == client_ip
            status, _ = await http_get(base + "/debug/config_dump?proxyID=nobody")
            assert status == 404
            status, body = await http_get(base + "/debug/configz")
            kinds = sorted(o["kind"] for o in json.loads(body)["objects"])
            assert kinds == ["Service", "WorkloadEntry"]

            # syncz over xDS, as pilotfish-ctl proxy-status reads it.
            async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as ch:
                s = AdsStream(ch)
                r = DiscoveryRequest(type_url=typeurls.DEBUG_SYNCZ)
                r.node.id = "sidecar~127.0.0.1~ctl.default~default.svc.cluster.local"
                r.node.metadata.update({"AUTO_REGISTER": "false"})
                await s.send(r)
                resp = await s.recv()
                configs = []
                for a in resp.resources:
                    cc = ClientConfig()
                    a.Unpack(cc)
                    configs.append(cc)
                envoy_cc = next(c for c in configs if client_ip in c.node.id)
                by_type = {g.type_url: g for g in envoy_cc.generic_xds_configs}
                assert by_type[typeurls.CLUSTER].config_status == 1  # SYNCED
                assert envoy_cc.node.metadata["CONTROL_PLANE_ID"] == "test-cp"
                await s.close()
        finally:
            envoy.stop()
    await app.close()


async def _is200(call: object) -> bool:
    status, _ = await call  # type: ignore[misc]
    return bool(status == 200)


def test_sidecar_fixture_is_valid_yaml() -> None:
    import yaml

    assert yaml.safe_load(textwrap.dedent(UNBINDABLE_SIDECAR))["kind"] == "Sidecar"
