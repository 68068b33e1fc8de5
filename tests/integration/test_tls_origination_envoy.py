"""Acceptance: an external HTTPS host through the mesh, with TLS originated by the sidecar as
a DestinationRule `tls.mode: SIMPLE` says. The app speaks plain HTTP to its Envoy; a real
HTTPS server (certificate from a test CA, outside the mesh: a MESH_EXTERNAL ServiceEntry)
must receive TLS with the configured SNI, and Envoy must verify it against `caCertificates`
and `subjectAltNames`: with another CA's file, or another name, nothing gets through."""

from __future__ import annotations

import json
import ssl
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agent.envoy.bootstrap import BootstrapOptions, build_bootstrap
from tests.support.controlplane import eventually, running_control_plane
from tests.support.envoy import EnvoyProcess
from tests.support.net import free_port, pod_ip
from tests.support.testca import TestCA

pytestmark = pytest.mark.envoy

HOST = "api.example.test"  # the external host the app calls
SNI = "secure.example.test"  # what the rule tells Envoy to send (the server's certificate name)
APP_PORT = 8000  # the ServiceEntry port: plain HTTP from the app to its sidecar


@dataclass
class HttpsServer:
    """An HTTPS server outside the mesh that reports, per request, the SNI and TLS version
    of the connection it arrived on."""

    host: str
    port: int
    cert: Path
    key: Path
    handshakes: list[str] = field(default_factory=list)  # SNI of every ClientHello
    served: list[dict[str, str]] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    _sni: dict[int, str] = field(default_factory=dict)

    async def start(self) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        context.sni_callback = self._on_hello
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port, ssl_context=context).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _on_hello(self, conn: ssl.SSLObject, name: str | None, _: ssl.SSLContext) -> None:
        self.handshakes.append(name or "")
        self._sni[id(conn)] = name or ""

    async def _handle(self, request: web.Request) -> web.Response:
        tls = request.transport.get_extra_info("ssl_object") if request.transport else None
        seen = {
            "sni": self._sni.get(id(tls), "") if tls is not None else "",
            "tls": tls.version() or "" if tls is not None else "",
            "host": request.host,
            "path": request.path,
        }
        self.served.append(seen)
        return web.Response(text=json.dumps(seen), content_type="application/json")


def mesh(server: HttpsServer, ca_file: Path, san: str = SNI) -> str:
    return textwrap.dedent(f"""
        apiVersion: networking.istio.io/v1
        kind: ServiceEntry
        metadata: {{name: api, namespace: default}}
        spec:
          hosts: [{HOST}]
          location: MESH_EXTERNAL
          resolution: STATIC
          ports: [{{number: {APP_PORT}, name: http, protocol: HTTP}}]
          endpoints: [{{address: "{server.host}", ports: {{http: {server.port}}}}}]
        ---
        apiVersion: networking.istio.io/v1
        kind: DestinationRule
        metadata: {{name: api, namespace: default}}
        spec:
          host: {HOST}
          trafficPolicy:
            tls:
              mode: SIMPLE
              caCertificates: {ca_file}
              sni: {SNI}
              subjectAltNames: [{san}]
        """)


async def call(client_ip: str, path: str) -> tuple[int, dict[str, Any]]:
    """Plain HTTP from the app to its sidecar's outbound listener for the external host."""
    timeout = aiohttp.ClientTimeout(total=10)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(f"http://{client_ip}:{APP_PORT}{path}", headers={"Host": HOST}) as r,
        ):
            body = await r.text()
            return r.status, json.loads(body) if r.status == 200 else {"text": body}
    except (aiohttp.ClientError, TimeoutError):
        return 0, {}


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_simple_tls_origination_to_an_external_https_host(
    tmp_path: Path, delta: bool
) -> None:
    ca, other_ca = TestCA(name="external root"), TestCA(name="someone else's root")
    ca_file, other_ca_file = tmp_path / "ca.pem", tmp_path / "other-ca.pem"
    ca_file.write_bytes(ca.root_pem)
    other_ca_file.write_bytes(other_ca.root_pem)
    cert, key = ca.server_cert([SNI]).write(tmp_path, "server")
    server_ip, client_ip = pod_ip(), pod_ip()
    server = HttpsServer(server_ip, free_port(server_ip), cert, key)
    await server.start()
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(mesh(server, ca_file))
    envoy: EnvoyProcess | None = None
    try:
        async with running_control_plane(cfg) as cp:
            assert not cp.watcher.errors and not cp.watcher.current.warnings
            boot = build_bootstrap(
                BootstrapOptions(
                    ip=client_ip,
                    pod_name="client",
                    labels={"app": "client"},
                    xds_address=f"127.0.0.1:{cp.xds_port}",
                    delta=delta,
                )
            )
            envoy = EnvoyProcess(boot, tmp_path / "envoy", name="client")
            envoy.start()

            async def served() -> tuple[int, dict[str, Any]] | None:
                status, body = await call(client_ip, "/v1/status")
                return (status, body) if status == 200 else None

            status, body = await eventually(served, timeout=30, what="TLS origination")
            # The server got TLS, with the rule's SNI (not the host the app called), and the
            # request itself as the app sent it.
            assert body == {"sni": SNI, "tls": body["tls"], "host": HOST, "path": "/v1/status"}
            assert body["tls"] in ("TLSv1.2", "TLSv1.3")
            assert server.handshakes and set(server.handshakes) == {SNI}
            for i in range(5):
                assert await call(client_ip, f"/n/{i}") == (
                    200,
                    {"sni": SNI, "tls": body["tls"], "host": HOST, "path": f"/n/{i}"},
                )

            # caCertificates is what Envoy trusts: another CA's root and the server's
            # certificate is refused, so nothing reaches the application.
            await reconfigure(envoy, cfg, mesh(server, other_ca_file), (str(other_ca_file), SNI))
            count = len(server.served)
            for _ in range(3):
                assert (await call(client_ip, "/refused"))[0] == 503
            assert len(server.served) == count

            # Trusted again, but the certificate does not name what subjectAltNames asks.
            wrong = "other.example.test"
            await reconfigure(envoy, cfg, mesh(server, ca_file, san=wrong), (str(ca_file), wrong))
            for _ in range(3):
                assert (await call(client_ip, "/wrong-name"))[0] == 503
            assert len(server.served) == count

            # And back: served again.
            await reconfigure(envoy, cfg, mesh(server, ca_file), (str(ca_file), SNI))
            assert (await call(client_ip, "/again"))[0] == 200
    finally:
        if envoy is not None:
            envoy.stop()
        await server.close()


CLUSTER = f"outbound|{APP_PORT}||{HOST}"


async def reconfigure(envoy: EnvoyProcess, cfg: Path, text: str, want: tuple[str, str]) -> None:
    """Write new config and wait until Envoy runs the cluster with the (CA file, SAN) wanted."""
    (cfg / "mesh.yaml").write_text(text)

    async def applied() -> bool:
        return await origination(envoy) == want

    await envoy.wait_for(applied, timeout=30, what=f"cluster TLS {want}")


async def origination(envoy: EnvoyProcess) -> tuple[str, str] | None:
    """(trusted CA file, SAN matched) of the external host's active cluster in Envoy."""
    for section in (await envoy.config_dump())["configs"]:
        for entry in section.get("dynamic_active_clusters", []):
            cluster = entry["cluster"]
            if cluster["name"] != CLUSTER:
                continue
            tls = cluster["transport_socket"]["typed_config"]
            validation = tls["common_tls_context"]["validation_context"]
            sans = validation.get("match_typed_subject_alt_names", [])
            return (
                validation["trusted_ca"]["filename"],
                sans[0]["matcher"]["exact"] if sans else "",
            )
    return None
