"""Gateway certificates end to end: a real control plane holds `v1 Secret`s (config files, or
the in-test Kubernetes API server), a router's agent fetches them over its one upstream
connection (SDS over ADS) and serves them on its SDS socket, and a real Envoy whose static
listener terminates TLS with `kubernetes://gw-cert` from that socket serves the Secret's
certificate to a real TLS client that verifies the chain.

Rotation (rewriting the file, or changing the Secret in the API server) changes what new
handshakes see within 5 s, with no failed request under concurrent load. A sidecar's agent
and a router of another namespace are refused (PERMISSION_DENIED on their SDS stream and
fetch); a missing Secret leaves the router's other certificates serving and is reported.

The router is a real `pilotfish-agent --proxy-type router` process; the test's own Envoy reads
the agent's SDS socket as the router's Envoy would."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest, DiscoveryResponse

from control.app import ControlPlane
from control.ca.identity import Identity
from protos import typeurls
from tests.integration.test_sds_envoy import Conn, bootstrap, mtls_listener, running_envoy
from tests.support.agentproc import AgentProcess
from tests.support.controlplane import (
    eventually,
    running_control_plane,
    running_kube_control_plane,
)
from tests.support.envoy import EnvoyProcess
from tests.support.gateways import router_pod
from tests.support.kubeapi import FakeKubeApi
from tests.support.mesh import mesh_agent
from tests.support.net import pod_ip
from tests.support.secrets import secret_object, secret_yaml
from tests.support.testca import IssuedCert, TestCA

pytestmark = pytest.mark.envoy

EDGE = Identity("edge", "gateway")
HOST = "gw.example.com"
SDS_SERVICE = "/envoy.service.secret.v3.SecretDiscoveryService"


@asynccontextmanager
async def router_sds(
    cp: ControlPlane, tmp: Path, identity: Identity = EDGE
) -> AsyncIterator[tuple[AgentProcess, Path]]:
    """A real router agent (`--proxy-type router`, its own Envoy serving no Gateway) on the
    control plane's TLS port; yields it and its SDS socket, where the test's Envoy reads."""
    agent = router_pod(
        cp,
        tmp,
        pod_ip(),
        "gw-1",
        "app=gw",
        namespace=identity.namespace,
        service_account=identity.service_account,
    )
    agent.start()
    sock = tmp / "gw-1" / "SDS"
    try:
        await eventually(sock.exists, timeout=30, what="router agent SDS socket")
        yield agent, sock
    finally:
        assert agent.terminate() == 0, agent.log()[-3000:]
    assert "Traceback" not in agent.log(), agent.log()[-3000:]


def tls_listener(name: str, ip: str, port: int, secret: str) -> dict[str, Any]:
    """An HTTPS listener answering 200 "hi" with `secret` (from SDS) as its certificate; no
    client certificate asked."""
    listener = mtls_listener(name, ip, port, secret, "unused")
    tls = listener["filter_chains"][0]["transport_socket"]["typed_config"]
    tls["require_client_certificate"] = False
    del tls["common_tls_context"]["validation_context_sds_secret_config"]
    # A secret that never comes must not hold Envoy's start (the other listeners serve).
    sds = tls["common_tls_context"]["tls_certificate_sds_secret_configs"][0]["sds_config"]
    sds["initial_fetch_timeout"] = "1s"
    return listener


def client_context(ca: TestCA) -> ssl.SSLContext:
    """A TLS client that verifies the chain against the Secret's CA and the host name."""
    return ssl.create_default_context(cadata=ca.root_pem.decode())


async def handshake_serial(ip: str, port: int, ctx: ssl.SSLContext) -> int:
    # Generous: the clients share two busy cores with the control plane and Envoy, and a slow
    # handshake is not a failed one.
    r, w = await asyncio.wait_for(
        asyncio.open_connection(ip, port, ssl=ctx, server_hostname=HOST), 20
    )
    conn = Conn(r, w)
    try:
        assert await conn.get() == (200, b"hi")
        return conn.peer_serial
    finally:
        await conn.close()


@dataclass
class Load:
    """Concurrent clients doing new handshakes and requests until stopped."""

    ip: str
    port: int
    ctx: ssl.SSLContext
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    serials: set[int] = field(default_factory=set)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def _worker(self) -> None:
        while not self._stop.is_set():
            try:
                self.serials.add(await handshake_serial(self.ip, self.port, self.ctx))
                self.ok += 1
            except (OSError, ssl.SSLError, AssertionError, TimeoutError) as e:
                self.failures.append(repr(e))

    @asynccontextmanager
    async def running(self, workers: int = 8) -> AsyncIterator[Load]:
        tasks = [asyncio.create_task(self._worker()) for _ in range(workers)]
        try:
            yield self
        finally:
            self._stop.set()
            await asyncio.gather(*tasks)


async def wait_serving(envoy: EnvoyProcess, ip: str, port: int, ctx: ssl.SSLContext) -> int:
    async def serial() -> int | None:
        try:
            return await handshake_serial(ip, port, ctx)
        except (OSError, ssl.SSLError, TimeoutError):
            return None

    async def serving() -> bool:
        return await serial() is not None

    await envoy.wait_for(serving, timeout=30, what="HTTPS listener serving the Secret")
    found = await serial()
    assert found is not None
    return found


async def rotate_under_load(
    envoy: EnvoyProcess,
    ip: str,
    port: int,
    ca: TestCA,
    first: IssuedCert,
    rotate: Any,
) -> None:
    ctx = client_context(ca)
    assert await wait_serving(envoy, ip, port, ctx) == first.serial
    async with Load(ip, port, ctx).running() as load:
        await eventually(lambda: load.ok >= 100, timeout=30, what="load running")
        newer = ca.server_cert([HOST])
        started = time.monotonic()
        await rotate(newer)
        # What new handshakes see changes within 5 s (the acceptance bound).
        await eventually(lambda: newer.serial in load.serials, timeout=5, what="rotated cert")
        took = time.monotonic() - started
        done = load.ok
        await eventually(lambda: load.ok >= done + 100, timeout=30, what="load after")
    assert load.failures == [], load.failures[:5]
    assert load.serials <= {first.serial, newer.serial}
    # After the switch, only the new certificate is served.
    assert await handshake_serial(ip, port, ctx) == newer.serial
    logging.getLogger(__name__).info("rotation seen after %.2fs, %d requests", took, load.ok)


def _write(cfg: Path, text: str) -> None:
    tmp = cfg / ".mesh.tmp"
    tmp.write_text(text)
    tmp.replace(cfg / "mesh.yaml")


@asynccontextmanager
async def gateway_envoy(
    cp: ControlPlane, tmp_path: Path, ip: str, listeners: list[dict[str, Any]]
) -> AsyncIterator[tuple[AgentProcess, EnvoyProcess]]:
    """A router agent, and the test's Envoy reading its SDS socket with `listeners`."""
    async with (
        router_sds(cp, tmp_path / "router") as (router, sock),
        running_envoy(bootstrap(ip, sock, listeners), tmp_path / "envoy") as envoy,
    ):
        yield router, envoy


async def test_envoy_serves_and_rotates_a_secret_from_a_config_file(tmp_path: Path) -> None:
    ip, port = pod_ip(), 8443
    ca = TestCA()
    first = ca.server_cert([HOST])
    cfg = tmp_path / "config"
    cfg.mkdir()
    _write(cfg, secret_yaml("gw-cert", first, namespace="edge"))
    listener = tls_listener("gw", ip, port, "kubernetes://gw-cert")
    async with (
        running_control_plane(cfg) as cp,
        gateway_envoy(cp, tmp_path, ip, [listener]) as (_, envoy),
    ):

        async def rotate(newer: IssuedCert) -> None:
            _write(cfg, secret_yaml("gw-cert", newer, namespace="edge"))

        await rotate_under_load(envoy, ip, port, ca, first, rotate)
        assert await envoy.stat("sds.kubernetes://gw-cert.update_rejected") in (0, None)


async def test_envoy_serves_and_rotates_a_secret_from_the_kubernetes_api(tmp_path: Path) -> None:
    ip, port = pod_ip(), 8443
    ca = TestCA()
    first = ca.server_cert([HOST])
    listener = tls_listener("gw", ip, port, "kubernetes://gw-cert")
    async with FakeKubeApi() as api:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig())
        api.put(secret_object("gw-cert", first, namespace="edge"))
        async with (
            running_kube_control_plane(kubeconfig) as cp,
            gateway_envoy(cp, tmp_path, ip, [listener]) as (_, envoy),
        ):

            async def rotate(newer: IssuedCert) -> None:
                api.put(secret_object("gw-cert", newer, namespace="edge"))

            await rotate_under_load(envoy, ip, port, ca, first, rotate)


async def test_a_missing_secret_leaves_the_others_serving_and_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ip, good_port, missing_port = pod_ip(), 8443, 9443
    ca = TestCA()
    cert = ca.server_cert([HOST])
    cfg = tmp_path / "config"
    cfg.mkdir()
    _write(cfg, secret_yaml("gw-cert", cert, namespace="edge"))
    caplog.set_level(logging.WARNING)
    listeners = [
        tls_listener("gw", ip, good_port, "kubernetes://gw-cert"),
        tls_listener("missing", ip, missing_port, "kubernetes://gw-missing"),
    ]
    async with (
        running_control_plane(cfg) as cp,
        gateway_envoy(cp, tmp_path, ip, listeners) as (router, envoy),
    ):
        assert await wait_serving(envoy, ip, good_port, client_context(ca)) == cert.serial

        def reported() -> bool:
            return any(
                r.name == "control.secretaccess" and "kubernetes://gw-missing" in r.getMessage()
                for r in caplog.records
            )

        # The control plane says which Secret it lacks, and so does the agent.
        await eventually(reported, what="control plane warning")
        await eventually(
            lambda: (
                "secret kubernetes://gw-missing: the control plane has no such Secret"
                in router.log()
            ),
            what="agent warning",
        )
        assert all(r.exc_info is None for r in caplog.records), "a traceback was logged"
        with pytest.raises((OSError, ssl.SSLError, TimeoutError)):
            await handshake_serial(ip, missing_port, client_context(ca))


async def _sds_status(sock: Path, name: str) -> tuple[grpc.StatusCode, str]:
    """StreamSecrets for `name` on an SDS socket, as Envoy asks: the status it ends with."""
    async with grpc.aio.insecure_channel(f"unix:{sock}") as channel:
        call = channel.stream_stream(
            f"{SDS_SERVICE}/StreamSecrets",
            request_serializer=DiscoveryRequest.SerializeToString,
            response_deserializer=DiscoveryResponse.FromString,
        )()
        await call.write(DiscoveryRequest(type_url=typeurls.SECRET, resource_names=[name]))
        try:
            async with asyncio.timeout(15):
                async for resp in call:
                    return grpc.StatusCode.OK, f"served {len(resp.resources)} resources"
        except grpc.aio.AioRpcError as e:
            return e.code(), e.details() or ""
        return await call.code(), await call.details()


async def _fetch_status(sock: Path, name: str, timeout: float = 15) -> tuple[grpc.StatusCode, str]:
    async with grpc.aio.insecure_channel(f"unix:{sock}") as channel:
        fetch = channel.unary_unary(
            f"{SDS_SERVICE}/FetchSecrets",
            request_serializer=DiscoveryRequest.SerializeToString,
            response_deserializer=DiscoveryResponse.FromString,
        )
        try:
            await fetch(
                DiscoveryRequest(type_url=typeurls.SECRET, resource_names=[name]), timeout=timeout
            )
        except grpc.aio.AioRpcError as e:
            return e.code(), e.details() or ""
        return grpc.StatusCode.OK, ""


async def test_a_sidecar_agent_and_another_namespace_router_get_permission_denied(
    tmp_path: Path,
) -> None:
    ca = TestCA()
    cfg = tmp_path / "config"
    cfg.mkdir()
    _write(cfg, secret_yaml("gw-cert", ca.server_cert([HOST]), namespace="edge"))
    async with running_control_plane(cfg) as cp:
        # A real sidecar agent (its own Envoy and all) of the Secret's namespace.
        sidecar_ip = pod_ip()
        sidecar = mesh_agent(
            cp, tmp_path, sidecar_ip, "app", "app=app", namespace="edge", service_account="app"
        )
        sidecar.start()
        try:
            sock = tmp_path / "app" / "SDS"
            await eventually(sock.exists, timeout=30, what="sidecar SDS socket")
            code, details = await _sds_status(sock, "kubernetes://gw-cert")
            assert code is grpc.StatusCode.PERMISSION_DENIED, (code, details)
            assert "only a gateway (router)" in details
            code, details = await _fetch_status(sock, "kubernetes://gw-cert")
            assert code is grpc.StatusCode.PERMISSION_DENIED, (code, details)
            # Its own certificate is still served on the same socket.
            code, _ = await _sds_status(sock, "default")
            assert code is grpc.StatusCode.OK
        finally:
            assert sidecar.terminate() == 0, sidecar.log()[-3000:]
        assert "Traceback" not in sidecar.log()

        # A router of another namespace asking for edge's Secret.
        async with router_sds(cp, tmp_path / "other", Identity("other", "gw")) as (_, sock):
            code, details = await _sds_status(sock, "kubernetes://edge/gw-cert")
            assert code is grpc.StatusCode.PERMISSION_DENIED, (code, details)
            assert "no ReferenceGrant" in details
            # Its own namespace has no such Secret: nothing is served, nothing is refused.
            code, details = await _fetch_status(sock, "kubernetes://gw-cert", timeout=3)
            assert code is grpc.StatusCode.UNAVAILABLE, (code, details)
