"""Issue 19's Istio Gateway acceptance with every part real: a control plane, a router pod
(`pilotfish-agent --proxy-type router` running its own Envoy), backends on pod IPs, and real
HTTP and TLS clients that verify what they are shown.

- HTTP by Host and path to two services; an unknown Host gets 404; `httpsRedirect` answers
  301; a GRPC server carries a real gRPC client's calls; a TCP server proxies to the
  VirtualService's tcp destination;
- HTTPS SIMPLE: SNI picks one of two file certificates (the client verifies the chain and
  the name); a third server whose certificate file is missing refuses its handshakes, is
  reported by the agent (no traceback), and holds nothing else back;
- MUTUAL refuses a client without a certificate and serves one with;
- PASSTHROUGH routes by SNI to a TLS backend whose own certificate the client sees;
- a second Gateway's conflicting server: one warning naming both, the older Gateway serves;
- gateway -> sidecar backend is mTLS: the app sees the gateway's SPIFFE ID in XFCC, and an
  AuthorizationPolicy allowing only that identity lets the gateway in and refuses a sidecar
  with another identity.
"""

from __future__ import annotations

import asyncio
import json
import logging
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from control.app import ControlPlane
from tests.e2e.test_ctl import columns, ctl
from tests.support.agentproc import AgentProcess
from tests.support.apps import EchoApp, TcpEchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.gateways import (
    GATEWAY_NS,
    GATEWAY_PRINCIPAL,
    GATEWAY_SPIFFE,
    Router,
    TlsBackend,
    client_context,
    doc,
    http_get,
    istio_gateway,
    kube_service,
    refused,
    router_agent,
    router_pod,
    router_ready,
    tls_get,
    workload_entry,
)
from tests.support.mesh import backend_yaml, mesh_agent, workload_group_yaml
from tests.support.net import pod_ip
from tests.support.testca import TestCA

pytestmark = pytest.mark.envoy


def dns_names(cert: x509.Certificate) -> list[str]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return list(san.get_values_for_type(x509.DNSName))


ECHO_METHOD = "/echo.Echo/Say"


async def echo_grpc_server(ip: str, port: int) -> grpc.aio.Server:
    """A gRPC backend (raw bytes in and out): answers `echo:<request>`."""

    async def say(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return b"echo:" + request

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "echo.Echo", {"Say": grpc.unary_unary_rpc_method_handler(say)}
            ),
        )
    )
    server.add_insecure_port(f"{ip}:{port}")
    await server.start()
    return server


# --- ingress -----------------------------------------------------------------------------------


def ingress_yaml(certs: dict[str, tuple[Path, Path]], client_ca: Path, missing: Path) -> str:
    a, b, m = certs["a"], certs["b"], certs["m"]
    return istio_gateway(
        "ingress",
        f"""
        - port: {{number: 8080, name: http, protocol: HTTP}}
          hosts: [alpha.example.com, beta.example.com]
        - port: {{number: 8090, name: grpc, protocol: GRPC}}
          hosts: [grpc.example.com]
        - port: {{number: 8081, name: http-redirect, protocol: HTTP}}
          hosts: [secure.example.com]
          tls: {{httpsRedirect: true}}
        - port: {{number: 8443, name: https-a, protocol: HTTPS}}
          hosts: [a.example.com]
          tls: {{mode: SIMPLE, serverCertificate: {a[0]}, privateKey: {a[1]}}}
        - port: {{number: 8443, name: https-b, protocol: HTTPS}}
          hosts: [b.example.com]
          tls: {{mode: SIMPLE, serverCertificate: {b[0]}, privateKey: {b[1]}}}
        - port: {{number: 8443, name: https-broken, protocol: HTTPS}}
          hosts: [broken.example.com]
          tls: {{mode: SIMPLE, serverCertificate: {missing}, privateKey: {missing}}}
        - port: {{number: 9443, name: https-mutual, protocol: HTTPS}}
          hosts: [m.example.com]
          tls:
            mode: MUTUAL
            serverCertificate: {m[0]}
            privateKey: {m[1]}
            caCertificates: {client_ca}
        - port: {{number: 9000, name: tcp, protocol: TCP}}
          hosts: ["*"]
        - port: {{number: 9444, name: tls-pass, protocol: TLS}}
          hosts: [pass.example.com]
          tls: {{mode: PASSTHROUGH}}
        """,
    ) + istio_gateway(
        "zz-late",
        """
        - port: {number: 8080, name: tcp, protocol: TCP}
          hosts: ["*"]
        """,
    )


def ingress_route(name: str, hosts: str, routes: str) -> str:
    """A VirtualService in `default` bound to the ingress Gateway; `routes` its route lines."""
    head = doc(
        f"""
        apiVersion: networking.istio.io/v1
        kind: VirtualService
        metadata: {{name: {name}, namespace: default}}
        spec:
          hosts: {hosts}
          gateways: [{GATEWAY_NS}/ingress]
        """
    )
    return head + textwrap.indent(textwrap.dedent(routes).strip("\n"), "  ") + "\n"


ROUTES = (
    ingress_route(
        "tcp",
        "[tcpecho]",
        "tcp: [{match: [{port: 9000}], route: [{destination: {host: tcpecho}}]}]",
    )
    + ingress_route("grpc", "[grpc.example.com]", "http: [{route: [{destination: {host: echo}}]}]")
    + ingress_route(
        "alpha",
        "[alpha.example.com, secure.example.com, a.example.com, b.example.com,"
        " broken.example.com, m.example.com]",
        "http: [{route: [{destination: {host: alpha}}]}]",
    )
    + ingress_route(
        "beta",
        "[beta.example.com]",
        """
        http:
        - match: [{uri: {prefix: /api}}]
          route: [{destination: {host: beta}}]
        - route: [{destination: {host: alpha}}]
        """,
    )
    + ingress_route(
        "pass",
        "[pass.example.com]",
        """
        tls:
        - match: [{port: 9444, sniHosts: [pass.example.com]}]
          route: [{destination: {host: tlsbackend, port: {number: 9443}}}]
        """,
    )
)


@dataclass
class Ingress:
    router: Router
    ca: TestCA
    root: bytes
    certs: dict[str, tuple[Path, Path]]
    client: tuple[Path, Path]
    backend_serial: int
    missing: Path


@asynccontextmanager
async def running_ingress(tmp_path: Path) -> AsyncIterator[Ingress]:
    ca = TestCA()
    files = tmp_path / "certs"
    files.mkdir()
    root = ca.root.public_bytes(serialization.Encoding.PEM)
    (files / "client-ca.pem").write_bytes(root)
    certs = {
        name: ca.server_cert([f"{name}.example.com"]).write(files, name) for name in ("a", "b", "m")
    }
    client = ca.client_cert("spiffe://example.com/client").write(files, "client")
    backend_cert = ca.server_cert(["pass.example.com"])
    missing = files / "gone.pem"

    alpha_ip, beta_ip, tls_ip, grpc_ip, tcp_ip = (pod_ip() for _ in range(5))
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(
        kube_service("alpha", 9080, 8080)
        + kube_service("beta", 9080, 8080)
        + kube_service("tlsbackend", 9443, 9443, "tls")
        + kube_service("echo", 9090, 9090, "grpc")
        + kube_service("tcpecho", 9000, 9000, "tcp")
        + workload_entry("tcpecho", tcp_ip)
        + workload_entry("echo", grpc_ip)
        + workload_entry("alpha", alpha_ip)
        + workload_entry("beta", beta_ip)
        + workload_entry("tlsbackend", tls_ip)
        + ingress_yaml(certs, files / "client-ca.pem", missing)
        + ROUTES
    )
    apps: list[EchoApp | TcpEchoApp] = [
        EchoApp("alpha", alpha_ip, 8080),
        EchoApp("beta", beta_ip, 8080),
        TcpEchoApp("tcpecho", tcp_ip, 9000),
    ]
    tls_backend = TlsBackend(tls_ip, 9443, backend_cert.write(files, "pass"))
    for app in apps:
        await app.start()
    await tls_backend.start()
    grpc_server = await echo_grpc_server(grpc_ip, 9090)
    router: Router | None = None
    try:
        async with running_control_plane(cfg) as cp:
            router = router_agent(cp, tmp_path)
            # The broken server's secret never comes: the listener starts after the SDS
            # initial fetch timeout (gateway_tls.py), so readiness takes a few seconds more.
            await eventually(
                lambda: router_ready(router.ip, router.agent), timeout=60, what="router ready"
            )
            yield Ingress(router, ca, root, certs, client, backend_cert.serial, missing)
    finally:
        if router is not None:
            router.agent.kill()
        await tls_backend.close()
        await grpc_server.stop(None)
        for app in apps:
            await app.close()


async def test_istio_gateway_ingress(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="control.generate.warn")
    async with running_ingress(tmp_path) as ing:
        ip = ing.router.ip

        # HTTP by Host and path to two services; an unknown Host is 404.
        async def app_of(host: str, path: str = "/") -> str:
            status, _, body = await http_get(ip, 8080, path, host)
            assert status == 200, (host, path, status, body)
            return str(json.loads(body)["app"])

        assert await app_of("alpha.example.com") == "alpha"
        assert await app_of("alpha.example.com", "/api/x") == "alpha"
        assert await app_of("beta.example.com", "/api/x") == "beta"
        assert await app_of("beta.example.com", "/other") == "alpha"
        status, _, _ = await http_get(ip, 8080, "/", "nobody.example.com")
        assert status == 404

        # GRPC: a real gRPC client over h2c, routed by :authority.
        async with grpc.aio.insecure_channel(
            f"{ip}:8090", options=[("grpc.default_authority", "grpc.example.com")]
        ) as channel:
            say = channel.unary_unary(ECHO_METHOD)
            assert await say(b"ping", timeout=10) == b"echo:ping"

        # TCP: the bytes go to the VirtualService's tcp destination and back.
        reader, writer = await asyncio.open_connection(ip, 9000)
        try:
            assert await asyncio.wait_for(reader.readline(), 10) == b"tcpecho\n"
            writer.write(b"hello\n")
            assert await asyncio.wait_for(reader.readline(), 10) == b"hello\n"
        finally:
            writer.close()

        # httpsRedirect: 301 to https, nothing proxied.
        status, headers, _ = await http_get(ip, 8081, "/login?x=1", "secure.example.com")
        assert status == 301
        assert headers["location"].startswith("https://secure.example.com"), headers
        assert headers["location"].endswith("/login?x=1"), headers

        # HTTPS SIMPLE: each SNI gets its own certificate, which verifies to the root.
        verified = client_context(ing.root)
        for name in ("a", "b"):
            sni = f"{name}.example.com"
            cert, status, body = await tls_get(ip, 8443, sni, verified)
            assert dns_names(cert) == [sni]
            assert status == 200 and json.loads(body)["app"] == "alpha"

        # The server whose certificate file is missing refuses its handshakes, the others
        # above were unaffected; the agent reports the file, without a traceback.
        assert await refused(ip, 8443, "broken.example.com", verified)
        log = ing.router.agent.log()
        assert str(ing.missing) in log
        assert "Traceback" not in log

        # MUTUAL: no client certificate, no answer; with one, served.
        assert await refused(ip, 9443, "m.example.com", verified)
        with_cert = client_context(ing.root, ing.client)
        cert, status, body = await tls_get(ip, 9443, "m.example.com", with_cert)
        assert dns_names(cert) == ["m.example.com"]
        assert status == 200 and json.loads(body)["app"] == "alpha"

        # PASSTHROUGH: the client sees the backend's own certificate, end to end.
        cert, status, body = await tls_get(ip, 9444, "pass.example.com", verified)
        assert cert.serial_number == ing.backend_serial
        assert status == 200 and body == "tlsbackend"

        # The conflicting TCP server of the younger Gateway: one warning naming both, and
        # the older Gateway's HTTP server is what port 8080 serves (checked above).
        conflicts = [r.getMessage() for r in caplog.records if "conflicts with" in r.getMessage()]
        assert len(conflicts) == 1, conflicts
        assert f"Gateway {GATEWAY_NS}/zz-late" in conflicts[0]
        assert f"Gateway {GATEWAY_NS}/ingress" in conflicts[0]
        assert "protocol TCP cannot share the port with HTTP" in conflicts[0]


# --- gateway -> sidecar backend ----------------------------------------------------------------


def mtls_mesh_yaml() -> str:
    return (
        backend_yaml("backend")
        + doc(
            f"""
            apiVersion: security.istio.io/v1
            kind: AuthorizationPolicy
            metadata: {{name: only-gateway, namespace: default}}
            spec:
              selector: {{matchLabels: {{app: backend}}}}
              action: ALLOW
              rules:
              - from: [{{source: {{principals: ["{GATEWAY_PRINCIPAL}"]}}}}]
            """
        )
        + istio_gateway(
            "ingress",
            """
            - port: {number: 8080, name: http, protocol: HTTP}
              hosts: ["*/backend.example.com"]
            """,
        )
        + doc(
            f"""
            apiVersion: networking.istio.io/v1
            kind: VirtualService
            metadata: {{name: backend-edge, namespace: default}}
            spec:
              hosts: [backend.example.com]
              gateways: [{GATEWAY_NS}/ingress]
              http: [{{route: [{{destination: {{host: backend, port: {{number: 9080}}}}}}]}}]
            """
        )
    )


async def test_gateway_to_sidecar_backend_is_mtls_and_authorized(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(mtls_mesh_yaml())
    backend_ip, other_ip = pod_ip(), pod_ip()
    app = EchoApp("backend", backend_ip, 8080)
    await app.start()
    agents: list[AgentProcess] = []
    try:
        async with running_control_plane(cfg) as cp:
            router = router_agent(cp, tmp_path)
            agents.append(router.agent)
            backend = mesh_agent(
                cp, tmp_path, backend_ip, "backend-0", "app=backend", group="backend"
            )
            other = mesh_agent(
                cp, tmp_path, other_ip, "other-0", "app=other", service_account="other"
            )
            for agent in (backend, other):
                agents.append(agent)
                agent.start()
            for ip, agent in ((router.ip, router.agent), (backend_ip, backend), (other_ip, other)):
                await eventually(lambda ip=ip, agent=agent: router_ready(ip, agent), timeout=60)

            async def through_gateway() -> tuple[int, str]:
                status, _, body = await http_get(router.ip, 8080, "/hello", "backend.example.com")
                return status, body

            # The backend registers through its WorkloadGroup: poll until it is an endpoint.
            status, body = await eventually(
                lambda: _ok(through_gateway()), timeout=30, what="gateway reaches backend"
            )
            seen = json.loads(body)
            assert seen["app"] == "backend"
            assert f"URI={GATEWAY_SPIFFE}" in (seen["xfcc"] or ""), seen
            # Another sidecar (service account `other`) is refused by the same policy.
            status, _, _ = await http_get(
                other_ip, 9080, "/hello", "backend.default.svc.cluster.local"
            )
            assert status == 403
            await check_ctl_sees_the_router(cp, router.ip)
    finally:
        for agent in agents:
            agent.kill()
        await app.close()


async def _ok(pending: object) -> tuple[int, str] | None:
    status, body = await pending  # type: ignore[misc]
    return (status, body) if status == 200 else None


async def check_ctl_sees_the_router(cp: ControlPlane, ip: str) -> None:
    """`pilotfish-ctl proxy-status` and `proxy-config` for a router as for a sidecar."""
    xds = f"127.0.0.1:{cp.xds_port}"

    async def router_row() -> list[str] | None:
        code, out, err = await ctl("proxy-status", "--xds-address", xds)
        assert code == 0, err
        _, rows = columns(out)
        row = next((r for r in rows if r[1] == ip), None)
        # A router gets no name table (no DNS proxy): NDS is not asked for.
        return row if row is not None and row[3:7] == ["SYNCED"] * 4 else None

    row = await eventually(router_row, timeout=20, what="router SYNCED")
    assert row[0] == f"ingress-0.{GATEWAY_NS}" and row[7] == "-", row
    code, out, err = await ctl("proxy-config", "listeners", ip)
    assert code == 0, err
    _, rows = columns(out)
    assert [r[:2] for r in rows if r[:2] == [ip, "8080"]], rows
    assert next(r[3] for r in rows if r[:2] == [ip, "8080"]) == "Route: http.8080"
    code, out, err = await ctl("proxy-config", "routes", ip)
    assert code == 0, err
    _, rows = columns(out)
    assert any(
        r[0] == "http.8080" and r[4] == "outbound|9080||backend.default.svc.cluster.local"
        for r in rows
    ), rows
    code, out, err = await ctl(
        "proxy-config",
        "listeners",
        f"ingress-0.{GATEWAY_NS}",
        "--http-address",
        f"127.0.0.1:{cp.http_port}",
        "-o",
        "json",
    )
    assert code == 0, err
    assert [x["name"] for x in json.loads(out)] == [f"{ip}_8080"]


# --- egress gateway ----------------------------------------------------------------------------


def egress_yaml(external_ip: str) -> str:
    """Istio's egress pattern: the external host as a ServiceEntry; the sidecars' route for
    it (`mesh`) goes to the egress gateway over ISTIO_MUTUAL (DestinationRule for the gateway
    hop); the gateway's route (the same VirtualService, bound to the Gateway too) goes out."""
    gateway_host = f"istio-egressgateway.{GATEWAY_NS}.svc.cluster.local"
    return (
        doc(
            f"""
            apiVersion: networking.istio.io/v1
            kind: ServiceEntry
            metadata: {{name: httpbin, namespace: default}}
            spec:
              hosts: [httpbin.example.com]
              location: MESH_EXTERNAL
              resolution: STATIC
              ports: [{{number: 8000, name: http, protocol: HTTP}}]
              endpoints: [{{address: "{external_ip}"}}]
            """
        )
        + doc(
            f"""
            apiVersion: v1
            kind: Service
            metadata: {{name: istio-egressgateway, namespace: {GATEWAY_NS}}}
            spec:
              selector: {{istio: egressgateway}}
              ports: [{{name: https, port: 443, targetPort: 8443}}]
            """
        )
        + "---\n"
        + workload_group_yaml(
            "egressgateway",
            GATEWAY_NS,
            service_account="egress",
            labels={"istio": "egressgateway"},
        )
        + istio_gateway(
            "egressgateway",
            """
            - port: {number: 8443, name: https, protocol: HTTPS}
              hosts: [httpbin.example.com]
              tls: {mode: ISTIO_MUTUAL}
            """,
            selector="egressgateway",
        )
        + doc(
            f"""
            apiVersion: networking.istio.io/v1
            kind: DestinationRule
            metadata: {{name: egressgateway, namespace: default}}
            spec:
              host: {gateway_host}
              trafficPolicy:
                tls: {{mode: ISTIO_MUTUAL, sni: httpbin.example.com}}
            """
        )
        + doc(
            f"""
            apiVersion: networking.istio.io/v1
            kind: VirtualService
            metadata: {{name: httpbin-egress, namespace: default}}
            spec:
              hosts: [httpbin.example.com]
              gateways: [mesh, {GATEWAY_NS}/egressgateway]
              http:
              - match: [{{gateways: [mesh], port: 8000}}]
                route: [{{destination: {{host: {gateway_host}, port: {{number: 443}}}}}}]
              - match: [{{gateways: [{GATEWAY_NS}/egressgateway], port: 8443}}]
                route: [{{destination: {{host: httpbin.example.com, port: {{number: 8000}}}}}}]
            """
        )
    )


async def test_egress_gateway_with_istio_mutual_from_the_sidecar(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    external_ip, egress_ip, client_ip = pod_ip(), pod_ip(), pod_ip()
    (cfg / "mesh.yaml").write_text(egress_yaml(external_ip))
    external = EchoApp("httpbin", external_ip, 8000)
    await external.start()
    agents: list[AgentProcess] = []
    try:
        async with running_control_plane(cfg) as cp:
            egress = router_pod(
                cp,
                tmp_path,
                egress_ip,
                "egress-0",
                "istio=egressgateway",
                namespace=GATEWAY_NS,
                group="egressgateway",
                service_account="egress",
            )
            client = mesh_agent(cp, tmp_path, client_ip, "client-0", "app=client")
            for agent in (egress, client):
                agents.append(agent)
                agent.start()
            for ip, agent in ((egress_ip, egress), (client_ip, client)):
                await eventually(lambda ip=ip, agent=agent: router_ready(ip, agent), timeout=60)

            async def from_client() -> tuple[int, str] | None:
                status, _, body = await http_get(client_ip, 8000, "/status", "httpbin.example.com")
                return (status, body) if status == 200 else None

            # The egress router registers through its WorkloadGroup: poll until it is the
            # gateway Service's endpoint.
            _, body = await eventually(from_client, timeout=30, what="client -> egress -> out")
            seen = json.loads(body)
            assert seen["app"] == "httpbin" and seen["path"] == "/status"
            # It went through the gateway, and the sidecar -> gateway hop was ISTIO_MUTUAL:
            # the gateway passes on the client certificate it verified.
            assert "URI=spiffe://cluster.local/ns/default/sa/default" in (seen["xfcc"] or ""), seen
            assert f"By=spiffe://cluster.local/ns/{GATEWAY_NS}/sa/egress" in seen["xfcc"], seen
    finally:
        for agent in agents:
            agent.kill()
        await external.close()
