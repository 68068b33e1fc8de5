"""An Istio Gateway whose HTTPS servers take their certificates from `v1 Secret`s
(`credentialName`), every part real: a control plane, a router pod (`pilotfish-agent
--proxy-type router` with its own Envoy), a backend on a pod IP, and TLS clients that verify
the chain and the name.

- HTTPS SIMPLE: SNI picks between two Secrets' certificates;
- MUTUAL from a Secret's `ca.crt` (`kubernetes://<name>-cacert`): a client without a
  certificate is refused, one with a certificate from that CA is served;
- rotating a Secret through the gateway: new handshakes see the new certificate within 5 s,
  with no failed request under concurrent load;
- a Gateway API Gateway's `certificateRefs`: its own namespace's Secret is served, another
  namespace's only once a ReferenceGrant there allows it.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import gateways as gw
from tests.support.apps import EchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.gatewayapi import (
    dump,
    gateway,
    gateway_class,
    listener,
    reference_grant,
    route,
    service,
)
from tests.support.net import pod_ip
from tests.support.secrets import secret_object, secret_yaml
from tests.support.testca import IssuedCert, TestCA

pytestmark = pytest.mark.envoy

HOSTS = ("one.example.com", "two.example.com", "m.example.com", "o.example.com")
# The one cipher suite the OPTIONAL_MUTUAL server allows (TLS 1.2; the test CA's keys are EC).
ALLOWED_CIPHER = "ECDHE-ECDSA-AES128-GCM-SHA256"


def gateway_yaml() -> str:
    return gw.istio_gateway(
        "ingress",
        """
        - port: {number: 8443, name: https-one, protocol: HTTPS}
          hosts: [one.example.com]
          tls: {mode: SIMPLE, credentialName: one-cert}
        - port: {number: 8443, name: https-two, protocol: HTTPS}
          hosts: [two.example.com]
          tls: {mode: SIMPLE, credentialName: two-cert}
        - port: {number: 9443, name: https-mutual, protocol: HTTPS}
          hosts: [m.example.com]
          tls: {mode: MUTUAL, credentialName: m-cert}
        - port: {number: 9444, name: https-optional, protocol: HTTPS}
          hosts: [o.example.com]
          tls:
            mode: OPTIONAL_MUTUAL
            credentialName: o-cert
            cipherSuites: [ECDHE-ECDSA-AES128-GCM-SHA256]
        """,
    ) + gw.doc(
        f"""
        apiVersion: networking.istio.io/v1
        kind: VirtualService
        metadata: {{name: alpha, namespace: default}}
        spec:
          hosts: [{", ".join(HOSTS)}]
          gateways: [{gw.GATEWAY_NS}/ingress]
          http: [{{route: [{{destination: {{host: alpha}}}}]}}]
        """
    )


@dataclass
class Site:
    cfg: Path
    ca: TestCA
    alpha_ip: str
    certs: dict[str, IssuedCert] = field(default_factory=dict)

    def write(self) -> None:
        text = (
            gw.kube_service("alpha", 9080, 8080)
            + gw.workload_entry("alpha", self.alpha_ip)
            + gateway_yaml()
            + secret_yaml("one-cert", self.certs["one"], namespace=gw.GATEWAY_NS)
            + secret_yaml("two-cert", self.certs["two"], namespace=gw.GATEWAY_NS)
            + secret_yaml("m-cert", self.certs["m"], namespace=gw.GATEWAY_NS, ca=self.ca.root_pem)
            + secret_yaml("o-cert", self.certs["o"], namespace=gw.GATEWAY_NS, ca=self.ca.root_pem)
        )
        tmp = self.cfg / ".mesh.tmp"
        tmp.write_text(text)
        tmp.replace(self.cfg / "mesh.yaml")


@asynccontextmanager
async def running_site(tmp_path: Path) -> AsyncIterator[tuple[Site, gw.Router]]:
    ca = TestCA()
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    site = Site(cfg, ca, pod_ip())
    site.certs = {
        name: ca.server_cert([f"{name}.example.com"]) for name in ("one", "two", "m", "o")
    }
    site.write()
    app = EchoApp("alpha", site.alpha_ip, 8080)
    await app.start()
    router: gw.Router | None = None
    try:
        async with running_control_plane(cfg) as cp:
            router = gw.router_agent(cp, tmp_path)
            await eventually(
                lambda: gw.router_ready(router.ip, router.agent), timeout=60, what="router ready"
            )
            yield site, router
    finally:
        if router is not None:
            assert router.agent.terminate() == 0, router.agent.log()[-3000:]
            assert "Traceback" not in router.agent.log(), router.agent.log()[-3000:]
        await app.close()


async def test_https_and_mutual_from_secrets_with_sni(tmp_path: Path) -> None:
    async with running_site(tmp_path) as (site, router):
        ctx = gw.client_context(site.ca.root_pem)
        for name in ("one", "two"):

            async def served(name: str = name) -> int | None:
                return await gw.served_serial(router.ip, 8443, f"{name}.example.com", ctx, "alpha")

            serial = await eventually(served, timeout=30, what=f"{name}.example.com over HTTPS")
            assert serial == site.certs[name].serial

        # MUTUAL: the client CA is the Secret's ca.crt (kubernetes://m-cert-cacert).
        assert await gw.refused(router.ip, 9443, "m.example.com", ctx)
        client = site.ca.client_cert("spiffe://example.com/client").write(tmp_path, "client")
        with_cert = gw.client_context(site.ca.root_pem, client)

        async def mutual() -> int | None:
            return await gw.served_serial(router.ip, 9443, "m.example.com", with_cert, "")

        assert await eventually(mutual, timeout=30, what="MUTUAL with a client cert") == (
            site.certs["m"].serial
        )
        # A client certificate from another CA is refused.
        stranger = TestCA(name="stranger").client_cert("spiffe://x/y").write(tmp_path, "stranger")
        assert await gw.refused(
            router.ip, 9443, "m.example.com", gw.client_context(site.ca.root_pem, stranger)
        )


async def test_optional_mutual_and_cipher_suites(tmp_path: Path) -> None:
    async with running_site(tmp_path) as (site, router):
        sni = "o.example.com"

        def tls12(ciphers: str, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
            ctx = gw.client_context(site.ca.root_pem, cert)
            ctx.maximum_version = ssl.TLSVersion.TLSv1_2  # cipherSuites apply up to TLS 1.2
            ctx.set_ciphers(ciphers)
            return ctx

        async def served(ctx: ssl.SSLContext) -> int | None:
            return await gw.served_serial(router.ip, 9444, sni, ctx, "alpha")

        # OPTIONAL_MUTUAL: served without a client certificate ...
        plain = tls12(ALLOWED_CIPHER)
        assert await eventually(lambda: served(plain), timeout=30, what="OPTIONAL_MUTUAL") == (
            site.certs["o"].serial
        )
        # ... and with one from the Secret's CA; one from another CA is refused.
        client = site.ca.client_cert("spiffe://example.com/client").write(tmp_path, "client")
        assert await served(tls12(ALLOWED_CIPHER, client)) == site.certs["o"].serial
        stranger = TestCA(name="stranger").client_cert("spiffe://x/y").write(tmp_path, "stranger")
        assert await gw.refused(router.ip, 9444, sni, tls12(ALLOWED_CIPHER, stranger))
        # cipherSuites: a client offering only another suite gets no handshake.
        assert await gw.refused(router.ip, 9444, sni, tls12("ECDHE-ECDSA-AES256-GCM-SHA384"))


async def test_rotating_a_secret_through_the_gateway_under_load(tmp_path: Path) -> None:
    async with running_site(tmp_path) as (site, router):
        ctx = gw.client_context(site.ca.root_pem)
        sni = "one.example.com"
        ok, failures, serials = 0, [], set()
        stop = asyncio.Event()

        async def once() -> int:
            cert, status, body = await gw.tls_get(router.ip, 8443, sni, ctx)
            assert status == 200 and "alpha" in body, (status, body)
            return cert.serial_number

        async def up() -> bool:
            try:
                return await once() == site.certs["one"].serial
            except (ssl.SSLError, OSError, TimeoutError, AssertionError):
                return False

        await eventually(up, timeout=30, what="gateway serving one-cert")

        async def worker() -> None:
            nonlocal ok
            while not stop.is_set():
                try:
                    serials.add(await once())
                    ok += 1
                except (ssl.SSLError, OSError, TimeoutError, AssertionError) as e:
                    failures.append(repr(e))

        workers = [asyncio.create_task(worker()) for _ in range(8)]
        try:
            await eventually(lambda: ok >= 100, timeout=30, what="load running")
            old = site.certs["one"]
            site.certs["one"] = newer = site.ca.server_cert([sni])
            started = time.monotonic()
            site.write()
            # New handshakes see the rotated certificate within 5 s (the acceptance bound).
            await eventually(lambda: newer.serial in serials, timeout=5, what="rotated cert")
            took = time.monotonic() - started
            done = ok
            await eventually(lambda: ok >= done + 100, timeout=30, what="load after rotation")
        finally:
            stop.set()
            await asyncio.gather(*workers)
        assert failures == [], failures[:5]
        assert serials <= {old.serial, newer.serial}
        assert await once() == newer.serial
        print(f"rotation through the gateway seen after {took:.2f}s; {ok} requests, 0 failed")


def _gateway_api_config(ca: TestCA, v1_ip: str, certs: dict[str, IssuedCert], grant: bool) -> str:
    def https(name: str, ref: dict[str, str]) -> dict[str, object]:
        return listener(
            name, 8443, "HTTPS", hostname=f"{name}.example.com", tls={"certificateRefs": [ref]}
        )

    objects: list[dict[str, object]] = [
        gateway_class(),
        gateway(
            listeners=[
                https("own", {"name": "own-cert"}),
                https("shared", {"name": "shared-cert", "namespace": "certs"}),
            ]
        ),
        service("v1"),
        {
            "apiVersion": "networking.istio.io/v1",
            "kind": "WorkloadEntry",
            "metadata": {"name": "v1", "namespace": "infra"},
            "spec": {"address": v1_ip, "labels": {"app": "v1"}},
        },
        route("site", hostnames=["own.example.com", "shared.example.com"]),
        secret_object("own-cert", certs["own"], namespace="infra"),
        secret_object("shared-cert", certs["shared"], namespace="certs"),
    ]
    if grant:
        objects.append(
            reference_grant("infra-gw", "certs", "infra", from_kind="Gateway", to_kind="Secret")
        )
    return dump(*objects)


async def test_gateway_api_certificate_refs_in_another_namespace_need_a_reference_grant(
    tmp_path: Path,
) -> None:
    ca = TestCA()
    certs = {name: ca.server_cert([f"{name}.example.com"]) for name in ("own", "shared")}
    v1_ip = pod_ip()
    cfg = tmp_path / "cfg"
    cfg.mkdir()

    def write(grant: bool) -> None:
        tmp = cfg / ".mesh.tmp"
        tmp.write_text(_gateway_api_config(ca, v1_ip, certs, grant))
        tmp.replace(cfg / "mesh.yaml")

    write(grant=False)
    app = EchoApp("v1", v1_ip, 8080)
    await app.start()
    try:
        async with running_control_plane(cfg) as cp:
            router = gw.router_pod(
                cp,
                tmp_path,
                pod_ip(),
                "gw-router",
                "gateway.networking.k8s.io/gateway-name=gw",
                namespace="infra",
                service_account="gw",
            )
            router.start()
            ctx = gw.client_context(ca.root_pem)

            async def serial(name: str) -> int | None:
                return await gw.served_serial(router.ip, 8443, f"{name}.example.com", ctx, "v1")

            try:
                own = await eventually(lambda: serial("own"), timeout=60, what="own Secret")
                assert own == certs["own"].serial
                # Another namespace's Secret without a ReferenceGrant: not served.
                assert await serial("shared") is None
                write(grant=True)
                shared = await eventually(
                    lambda: serial("shared"), timeout=30, what="granted Secret served"
                )
                assert shared == certs["shared"].serial
            finally:
                assert router.terminate() == 0, router.log()[-3000:]
            assert "Traceback" not in router.log()
    finally:
        await app.close()
