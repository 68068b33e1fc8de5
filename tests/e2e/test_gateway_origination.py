"""A gateway originating mutual TLS with a DestinationRule's `credentialName`, every part
real: a control plane, a router pod (`pilotfish-agent --proxy-type router` with its own
Envoy) and an HTTPS server outside the mesh that requires a client certificate from its CA.
Plain HTTP into the gateway leaves it as mTLS with the Secret's certificate (served to the
router's Envoy over SDS as `kubernetes://<name>`, the server checked against the Secret's
`ca.crt` as `kubernetes://<name>-cacert`); a rotated Secret is what the next connection
presents."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web
from cryptography import x509

from tests.support import gateways as gw
from tests.support.controlplane import eventually, running_control_plane
from tests.support.net import pod_ip
from tests.support.secrets import secret_yaml
from tests.support.testca import IssuedCert, TestCA

pytestmark = pytest.mark.envoy

UPSTREAM = "secure.example.com"


def mesh_yaml(upstream_ip: str, credential: IssuedCert, ca: bytes) -> str:
    return (
        gw.istio_gateway(
            "egress",
            """
            - port: {number: 8080, name: http, protocol: HTTP}
              hosts: [egress.example.com]
            """,
        )
        + gw.doc(
            f"""
            apiVersion: networking.istio.io/v1
            kind: ServiceEntry
            metadata: {{name: secure, namespace: {gw.GATEWAY_NS}}}
            spec:
              hosts: [{UPSTREAM}]
              location: MESH_EXTERNAL
              resolution: STATIC
              ports: [{{number: 8443, name: http, protocol: HTTP}}]
              endpoints: [{{address: "{upstream_ip}"}}]
            """
        )
        + gw.doc(
            f"""
            apiVersion: networking.istio.io/v1
            kind: VirtualService
            metadata: {{name: egress, namespace: {gw.GATEWAY_NS}}}
            spec:
              hosts: [egress.example.com]
              gateways: [egress]
              http: [{{route: [{{destination: {{host: {UPSTREAM}, port: {{number: 8443}}}}}}]}}]
            """
        )
        + gw.doc(
            f"""
            apiVersion: networking.istio.io/v1
            kind: DestinationRule
            metadata: {{name: secure, namespace: {gw.GATEWAY_NS}}}
            spec:
              host: {UPSTREAM}
              trafficPolicy:
                tls:
                  mode: MUTUAL
                  credentialName: egress-cred
                  sni: {UPSTREAM}
                  subjectAltNames: [{UPSTREAM}]
            """
        )
        + secret_yaml("egress-cred", credential, namespace=gw.GATEWAY_NS, ca=ca)
    )


@asynccontextmanager
async def upstream(ip: str, ca: TestCA, tmp_path: Path) -> AsyncIterator[None]:
    """An HTTPS server that requires a client certificate from `ca` and answers with the
    serial number of the one it was shown."""
    cert, key = ca.server_cert([UPSTREAM]).write(tmp_path, "upstream")
    roots = tmp_path / "upstream-roots.pem"
    roots.write_bytes(ca.root_pem)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(roots))
    context.load_cert_chain(str(cert), str(key))
    context.verify_mode = ssl.CERT_REQUIRED

    async def handle(request: web.Request) -> web.Response:
        der = request.transport.get_extra_info("ssl_object").getpeercert(binary_form=True)  # type: ignore[union-attr]
        serial = x509.load_der_x509_certificate(der).serial_number
        return web.Response(text=f"client serial {serial}", headers={"Connection": "close"})

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, ip, 8443, ssl_context=context).start()
    try:
        yield
    finally:
        await runner.cleanup()


async def test_a_gateway_originates_mtls_with_a_secret(tmp_path: Path) -> None:
    ca = TestCA()
    first = ca.client_cert("spiffe://example.com/egress")
    upstream_ip = pod_ip()
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    mesh = cfg / "mesh.yaml"
    mesh.write_text(mesh_yaml(upstream_ip, first, ca.root_pem))
    router: gw.Router | None = None
    async with upstream(upstream_ip, ca, tmp_path), running_control_plane(cfg) as cp:
        assert not cp.watcher.errors, cp.watcher.errors
        try:
            router = gw.router_agent(cp, tmp_path)
            await eventually(
                lambda: gw.router_ready(router.ip, router.agent), timeout=60, what="router"
            )

            async def answer() -> str:
                status, _, body = await gw.http_get(router.ip, 8080, "/", "egress.example.com")
                return body if status == 200 else f"status {status}"

            async def presents(cert: IssuedCert) -> bool:
                return await answer() == f"client serial {cert.serial}"

            await eventually(lambda: presents(first), timeout=30, what="mTLS with the Secret")

            # A certificate the server does not trust: the origination fails (503); the
            # Secret's own again, and it works.
            stranger = TestCA(name="stranger").client_cert("spiffe://x/y")
            mesh.write_text(mesh_yaml(upstream_ip, stranger, ca.root_pem))
            await eventually(
                lambda: _is(answer(), "status 503"), timeout=30, what="untrusted refused"
            )
            second = ca.client_cert("spiffe://example.com/egress")
            mesh.write_text(mesh_yaml(upstream_ip, second, ca.root_pem))
            await eventually(lambda: presents(second), timeout=30, what="rotated Secret")
        finally:
            if router is not None:
                assert router.agent.terminate() == 0, router.agent.log()[-3000:]
                assert "Traceback" not in router.agent.log(), router.agent.log()[-3000:]


async def _is(call: object, want: str) -> bool:
    return bool(await call == want)  # type: ignore[misc]
