"""Gateway test material: a router proxy, and a mesh with one Istio Gateway of every server
shape (HTTP with a redirect, HTTPS SIMPLE by SNI, MUTUAL from a Secret, PASSTHROUGH, TCP)
and the VirtualServices bound to it.

For the end-to-end gateway tests (tests/e2e/test_gateway_*.py, test_gatewayapi_router.py):
router pods (a real `pilotfish-agent --proxy-type router`), the YAML they are configured
with, the HTTP and TLS clients that talk to them, and a TLS backend outside the mesh."""

from __future__ import annotations

import asyncio
import ssl
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from control.app import ControlPlane
from control.model.proxy import Proxy, proxy_from_node
from protos.telemetry import ALS_NODE_METADATA, LOG_NODE_METADATA
from tests.support.agentproc import AgentProcess
from tests.support.mesh import mesh_agent
from tests.support.net import pod_ip
from tests.support.traffic import service

ROUTER_IP = "127.0.1.9"


def router(
    labels: Mapping[str, str] | None = None,
    *,
    ip: str = ROUTER_IP,
    namespace: str = "edge",
    mode: str = "NONE",
    als: bool = False,
    log: str = "",
) -> Proxy:
    meta: dict[str, object] = {
        "LABELS": dict(labels or {"istio": "ingressgateway"}),
        "SDS": "true",
        "INTERCEPTION_MODE": mode,
        "SERVICE_ACCOUNT": "ingress",
    }
    if als:
        meta[ALS_NODE_METADATA] = "true"
    if log:
        meta[LOG_NODE_METADATA] = log
    return proxy_from_node(f"router~{ip}~ingress.{namespace}~{namespace}.svc.cluster.local", meta)


_GATEWAYS = """
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: a, namespace: edge}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: [plain.example.com]
  - port: {number: 80, name: http-secure, protocol: HTTP}
    hosts: [secure.example.com]
    tls: {httpsRedirect: true}
  - port: {number: 443, name: https-a, protocol: HTTPS}
    bind: 127.0.1.40
    hosts: [a.example.com]
    tls: {mode: SIMPLE, serverCertificate: /certs/a.pem, privateKey: /certs/a.key}
  - port: {number: 8443, name: mtls, protocol: HTTPS}
    hosts: ["*"]
    tls: {mode: MUTUAL, credentialName: shop-cert, subjectAltNames: [client.example.com]}
  - port: {number: 9443, name: pass, protocol: TLS}
    hosts: ["*.example.com"]
    tls: {mode: PASSTHROUGH}
  - port: {number: 3306, name: db, protocol: TCP}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: b, namespace: edge}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 443, name: https-b, protocol: HTTPS}
    bind: 127.0.1.40
    hosts: [b.example.com]
    tls: {mode: SIMPLE, serverCertificate: /certs/b.pem, privateKey: /certs/b.key}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: site, namespace: default}
spec:
  hosts: [plain.example.com, secure.example.com, a.example.com, b.example.com]
  gateways: [edge/a, edge/b]
  http:
  - match: [{uri: {prefix: /ratings}}]
    route: [{destination: {host: ratings}}]
  - route: [{destination: {host: reviews}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: mtls, namespace: default}
spec:
  hosts: [mtls.example.com]
  gateways: [edge/a]
  http: [{route: [{destination: {host: reviews}}]}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: pass, namespace: default}
spec:
  hosts: [pass.example.com]
  gateways: [edge/a]
  tls:
  - match: [{port: 9443, sniHosts: [pass.example.com]}]
    route: [{destination: {host: tlsbackend, port: {number: 9443}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: db, namespace: default}
spec:
  hosts: [db]
  gateways: [edge/a]
  tcp: [{route: [{destination: {host: db, port: {number: 3306}}}]}]
"""

# The backends the gateways route to.
SERVICES = "".join(
    (
        service("reviews", "reviews"),
        service("ratings", "ratings"),
        service("tlsbackend", "tlsbackend", 9443, None, "tls"),
        service("db", "db", 3306, None, "tcp"),
    )
)
GATEWAY_MESH = SERVICES + _GATEWAYS


# --- end to end: router pods ---------------------------------------------------------------

GATEWAY_NS = "istio-system"
GATEWAY_SA = "ingress"
GATEWAY_PRINCIPAL = f"cluster.local/ns/{GATEWAY_NS}/sa/{GATEWAY_SA}"
GATEWAY_SPIFFE = f"spiffe://{GATEWAY_PRINCIPAL}"


def doc(text: str) -> str:
    """One YAML document of a multi-document file, from an indented literal."""
    return "---\n" + textwrap.dedent(text).strip() + "\n"


def istio_gateway(
    name: str, servers: str, *, selector: str = "ingressgateway", namespace: str = GATEWAY_NS
) -> str:
    """An Istio Gateway selecting the routers labelled `istio=<selector>`; `servers`: its
    server list items (YAML, indented as one block)."""
    head = doc(
        f"""
        apiVersion: networking.istio.io/v1
        kind: Gateway
        metadata: {{name: {name}, namespace: {namespace}}}
        spec:
          selector: {{istio: {selector}}}
          servers:
        """
    )
    return head + textwrap.indent(textwrap.dedent(servers).strip("\n"), "  ").rstrip() + "\n"


def workload_entry(name: str, ip: str) -> str:
    return doc(
        f"""
        apiVersion: networking.istio.io/v1
        kind: WorkloadEntry
        metadata: {{name: {name}, namespace: default}}
        spec: {{address: "{ip}", labels: {{app: {name}}}}}
        """
    )


def kube_service(name: str, port: int, target: int, port_name: str = "http") -> str:
    return doc(
        f"""
        apiVersion: v1
        kind: Service
        metadata: {{name: {name}, namespace: default}}
        spec:
          selector: {{app: {name}}}
          ports: [{{name: {port_name}, port: {port}, targetPort: {target}}}]
        """
    )


def router_pod(
    cp: ControlPlane,
    tmp_path: Path,
    ip: str,
    pod: str,
    labels: str,
    *,
    namespace: str,
    service_account: str,
    group: str = "",
) -> AgentProcess:
    """A router agent (`--proxy-type router`) on the control plane's TLS port, not started."""
    return mesh_agent(
        cp,
        tmp_path,
        ip,
        pod,
        labels,
        "--proxy-type",
        "router",
        namespace=namespace,
        group=group,
        service_account=service_account,
    )


@dataclass
class Router:
    ip: str
    agent: AgentProcess


async def router_ready(ip: str, agent: AgentProcess) -> bool:
    if agent.proc is not None and agent.proc.poll() is not None:
        raise AssertionError(f"agent at {ip} exited:\n{agent.log()[-3000:]}")
    status, _, _ = await http_get(ip, 15020, "/healthz/ready", "")
    return status == 200


def router_agent(cp: ControlPlane, tmp_path: Path) -> Router:
    """The ingress router pod (`istio=ingressgateway` in GATEWAY_NS), started."""
    ip = pod_ip()
    agent = router_pod(
        cp,
        tmp_path,
        ip,
        "ingress-0",
        "istio=ingressgateway",
        namespace=GATEWAY_NS,
        service_account=GATEWAY_SA,
    )
    agent.start()
    return Router(ip, agent)


# --- end to end: clients -------------------------------------------------------------------


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str, host: str
) -> tuple[int, dict[str, str], str]:
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    if not lines[0].startswith("HTTP/1.1 "):
        return 0, {}, ""
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    return int(lines[0].split()[1]), headers, body.decode(errors="replace")


async def http_get(ip: str, port: int, path: str, host: str) -> tuple[int, dict[str, str], str]:
    """(status, headers, body) of one plaintext HTTP/1.1 request; status 0 when refused."""
    try:
        reader, writer = await asyncio.open_connection(ip, port)
    except OSError:
        return 0, {}, ""
    try:
        return await _exchange(reader, writer, path, host or ip)
    except (OSError, TimeoutError):
        return 0, {}, ""


def client_context(root: bytes, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    """A TLS client that verifies the chain to `root` and the server's name."""
    ctx = ssl.create_default_context(cadata=root.decode())
    if cert is not None:
        ctx.load_cert_chain(*cert)
    return ctx


async def tls_get(
    ip: str, port: int, sni: str, ctx: ssl.SSLContext, path: str = "/"
) -> tuple[x509.Certificate, int, str]:
    """Connect with SNI `sni` (verified), return the server's certificate and the answer to
    one request for `path` with Host `sni`. Raises on a refused handshake."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(ip, port, ssl=ctx, server_hostname=sni), 10
    )
    ssl_object = writer.get_extra_info("ssl_object")
    der = ssl_object.getpeercert(binary_form=True)
    status, _, body = await _exchange(reader, writer, path, sni)
    return x509.load_der_x509_certificate(der), status, body


async def served_serial(
    ip: str, port: int, sni: str, ctx: ssl.SSLContext, body_has: str
) -> int | None:
    """The serial of the certificate served for `sni`, once a request through it answers 200
    with `body_has` in the body; None while it does not (yet)."""
    try:
        cert, status, body = await tls_get(ip, port, sni, ctx)
    except (ssl.SSLError, OSError, TimeoutError):
        return None
    return cert.serial_number if status == 200 and body_has in body else None


async def refused(ip: str, port: int, sni: str, ctx: ssl.SSLContext) -> bool:
    """No answer over TLS: the handshake fails, or (TLS 1.3, where the server's verdict on a
    client certificate comes after the client's handshake) the first read does."""
    try:
        _, status, _ = await tls_get(ip, port, sni, ctx)
    except (ssl.SSLError, OSError, ValueError, TimeoutError):
        return True
    return status == 0


@dataclass
class TlsBackend:
    """A TLS server (PASSTHROUGH's backend, a TLS service's endpoint): answers an HTTP
    request with its name."""

    ip: str
    port: int
    cert: tuple[Path, Path]
    name: str = "tlsbackend"
    _server: asyncio.Server | None = None

    async def start(self) -> None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(*self.cert)
        self._server = await asyncio.start_server(self._handle, self.ip, self.port, ssl=ctx)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            body = self.name.encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                % (len(body), body)
            )
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
