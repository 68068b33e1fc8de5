"""The Kubernetes Gateway API end to end: a real router (`pilotfish-agent --proxy-type router`,
real Envoy) serving a Gateway API Gateway from config files, with HTTPRoutes and a GRPCRoute:
a 90/10 weighted split measured over 1,000 requests, header and path matches, a URLRewrite
and a RequestRedirect, a GRPCRoute reached by a real grpcio client, and an HTTPRoute in
another namespace refused without a ReferenceGrant (status RefNotPermitted, its requests
answered 500) and served once one exists; a TLSRoute passthrough by SNI (the client sees the
backend's own certificate) and a TCPRoute; and the same from the Kubernetes API, with the
status written back there."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from cryptography.hazmat.primitives import serialization

from control.app import ControlPlane
from control.model.gatewayapi import GROUP
from tests.integration.test_proxyless_grpc import METHOD
from tests.integration.test_proxyless_grpc import backend as grpc_backend
from tests.support.agentproc import AgentProcess
from tests.support.apps import EchoApp, TcpEchoApp
from tests.support.controlplane import (
    eventually,
    running_control_plane,
    running_kube_control_plane,
)
from tests.support.gatewayapi import (
    backend,
    dump,
    gateway,
    gateway_class,
    listener,
    reference_grant,
    route,
)
from tests.support.gateways import TlsBackend, client_context, refused, router_pod, tls_get
from tests.support.kubeapi import FakeKubeApi
from tests.support.kubeapi import pod as kube_pod
from tests.support.net import pod_ip
from tests.support.testca import TestCA

pytestmark = pytest.mark.envoy

GATEWAY_PORT = 8080
APP_PORT = 8080
GRPC_PORT = 8080


def _service(name: str, namespace: str, port_name: str = "http") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"app": name},
            "ports": [{"name": port_name, "port": APP_PORT, "targetPort": APP_PORT}],
        },
    }


def _workload(name: str, namespace: str, ip: str) -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "WorkloadEntry",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"address": ip, "labels": {"app": name}},
    }


def _routes() -> list[dict[str, Any]]:
    rewrite = {
        "type": "URLRewrite",
        "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/inner"}},
    }
    redirect = {
        "type": "RequestRedirect",
        "requestRedirect": {"scheme": "https", "hostname": "secure.example.com", "statusCode": 301},
    }
    return [
        route(
            "split",
            hostnames=["split.example.com"],
            rules=[{"backendRefs": [backend("v1", weight=90), backend("v2", weight=10)]}],
        ),
        route(
            "matches",
            hostnames=["match.example.com"],
            rules=[
                {
                    "matches": [{"headers": [{"name": "x-version", "value": "v2"}]}],
                    "backendRefs": [backend("v2")],
                },
                {
                    "matches": [{"path": {"type": "Exact", "value": "/only-v1"}}],
                    "backendRefs": [backend("v1")],
                },
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/api"}}],
                    "filters": [rewrite],
                    "backendRefs": [backend("v2")],
                },
                {"matches": [{"path": {"value": "/old"}}], "filters": [redirect]},
                {"backendRefs": [backend("v1")]},
            ],
        ),
        route(
            "echo",
            kind="GRPCRoute",
            hostnames=["grpc.example.com"],
            rules=[
                {
                    "matches": [{"method": {"service": METHOD.split("/")[1]}}],
                    "backendRefs": [backend("echo")],
                }
            ],
        ),
    ]


def _cross_namespace_route() -> dict[str, Any]:
    return route(
        "guest",
        "apps",
        parents=[{"name": "gw", "namespace": "infra"}],
        hostnames=["guest.example.com"],
        rules=[{"backendRefs": [backend("v2", namespace="infra")]}],
    )


def _config(ips: dict[str, str], *extra: dict[str, Any]) -> str:
    objects: list[dict[str, Any]] = [
        gateway_class(),
        gateway(listeners=[listener("http", GATEWAY_PORT, from_="All")]),
        _service("v1", "infra"),
        _service("v2", "infra"),
        _service("echo", "infra", "grpc"),
        *(_workload(name, "infra", ip) for name, ip in ips.items()),
        *_routes(),
        _cross_namespace_route(),
        *extra,
    ]
    return dump(*objects)


async def _get(
    session: aiohttp.ClientSession, url: str, host: str, **headers: str
) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with session.get(url, headers={"Host": host, **headers}, allow_redirects=False) as r:
        text = await r.text()
        body = json.loads(text) if r.content_type == "application/json" else {}
        return r.status, body, {k.lower(): v for k, v in r.headers.items()}


def _route_reasons(cp: ControlPlane, namespace: str, name: str) -> dict[str, str]:
    for s in cp.watcher.current.gateway_api_status:
        if (s.kind, s.namespace, s.name) == ("HTTPRoute", namespace, name) and s.parents:
            return {c.type: c.reason for c in s.parents[0].conditions}
    return {}


def _router(cp: ControlPlane, tmp_path: Path, ip: str) -> AgentProcess:
    """The router pod of Gateway infra/gw (labelled with its name), started."""
    router = router_pod(
        cp,
        tmp_path,
        ip,
        "gw-router",
        "gateway.networking.k8s.io/gateway-name=gw",
        namespace="infra",
        service_account="gw",
    )
    router.start()
    return router


@contextlib.asynccontextmanager
async def _apps(ips: dict[str, str]) -> AsyncIterator[dict[str, EchoApp]]:
    apps = {name: EchoApp(name, ips[name], APP_PORT) for name in ("v1", "v2")}
    for app in apps.values():
        await app.start()
    try:
        async with grpc_backend("echo", ips["echo"], GRPC_PORT):
            yield apps
    finally:
        for app in apps.values():
            await app.close()


async def test_gateway_api_routes_through_a_real_router(tmp_path: Path) -> None:
    ips = {"v1": pod_ip(), "v2": pod_ip(), "echo": pod_ip()}
    router_ip = pod_ip()
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "gateway.yaml").write_text(_config(ips))
    url = f"http://{router_ip}:{GATEWAY_PORT}"
    async with _apps(ips), running_control_plane(cfg) as cp:
        router = _router(cp, tmp_path, router_ip)
        try:
            async with aiohttp.ClientSession() as session:

                async def served() -> bool:
                    try:
                        status, body, _ = await _get(session, url + "/", "match.example.com")
                    except aiohttp.ClientError:
                        return False
                    return status == 200 and body.get("app") == "v1"

                await eventually(served, timeout=30, what="router serving the Gateway")

                # 90/10 over 1,000 requests.
                counts: Counter[str] = Counter()
                for _ in range(1000):
                    status, body, _ = await _get(session, url + "/", "split.example.com")
                    assert status == 200
                    counts[body["app"]] += 1
                assert counts["v1"] + counts["v2"] == 1000
                assert abs(counts["v2"] - 100) <= 50, counts

                # Header and path matches, a URLRewrite and a RequestRedirect.
                _, body, _ = await _get(
                    session, url + "/x", "match.example.com", **{"x-version": "v2"}
                )
                assert body["app"] == "v2"
                _, body, _ = await _get(session, url + "/only-v1", "match.example.com")
                assert body["app"] == "v1"
                _, body, _ = await _get(session, url + "/api/items", "match.example.com")
                assert (body["app"], body["path"]) == ("v2", "/inner/items")
                _, body, _ = await _get(session, url + "/apiary", "match.example.com")
                assert (body["app"], body["path"]) == ("v1", "/apiary")  # not the /api prefix
                status, _, headers = await _get(session, url + "/old/page", "match.example.com")
                assert status == 301
                assert headers["location"] == "https://secure.example.com/old/page"

                # A GRPCRoute, called by a real grpcio client.
                options = (("grpc.default_authority", "grpc.example.com"),)
                async with grpc.aio.insecure_channel(
                    f"{router_ip}:{GATEWAY_PORT}", options=options
                ) as channel:
                    reply = await channel.unary_unary(METHOD)(b"", timeout=5)
                assert reply == b"echo"

                # Another namespace's route: refused until a ReferenceGrant allows its backend.
                assert _route_reasons(cp, "apps", "guest")["ResolvedRefs"] == "RefNotPermitted"
                status, _, _ = await _get(session, url + "/", "guest.example.com")
                assert status == 500  # accepted, but its backend may not be reached
                grant = reference_grant("apps-to-infra", "infra", "apps")
                (cfg / "gateway.yaml").write_text(_config(ips, grant))
                await eventually(
                    lambda: (
                        _route_reasons(cp, "apps", "guest").get("ResolvedRefs") == "ResolvedRefs"
                    ),
                    what="grant seen",
                )

                async def guest_served() -> bool:
                    status, body, _ = await _get(session, url + "/", "guest.example.com")
                    return status == 200 and body.get("app") == "v2"

                await eventually(guest_served, timeout=15, what="guest route served")
                await asyncio.sleep(0)
        finally:
            assert router.terminate() == 0, router.log()[-3000:]


async def test_tls_passthrough_and_tcp_routes_through_a_real_router(tmp_path: Path) -> None:
    ca = TestCA()
    files = tmp_path / "certs"
    files.mkdir()
    issued = ca.server_cert(["pass.example.com"])
    root = ca.root.public_bytes(serialization.Encoding.PEM)
    tls_ip, tcp_ip, router_ip = pod_ip(), pod_ip(), pod_ip()
    alpha = f"{GROUP}/v1alpha2"
    objects = [
        gateway_class(),
        gateway(
            listeners=[
                listener("pass", 9443, "TLS", tls={"mode": "Passthrough"}),
                listener("tcp", 9000, "TCP"),
            ]
        ),
        _service("tlsbackend", "infra", "tls"),
        _service("db", "infra", "tcp"),
        _workload("tlsbackend", "infra", tls_ip),
        _workload("db", "infra", tcp_ip),
        route(
            "pass",
            kind="TLSRoute",
            api_version=alpha,
            hostnames=["pass.example.com"],
            rules=[{"backendRefs": [backend("tlsbackend")]}],
        ),
        route("db", kind="TCPRoute", api_version=alpha, rules=[{"backendRefs": [backend("db")]}]),
    ]
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "gateway.yaml").write_text(dump(*objects))
    tls_backend = TlsBackend(tls_ip, APP_PORT, issued.write(files, "pass"))
    tcp_backend = TcpEchoApp("db", tcp_ip, APP_PORT)
    await tls_backend.start()
    await tcp_backend.start()
    try:
        async with running_control_plane(cfg) as cp:
            router = _router(cp, tmp_path, router_ip)
            try:

                async def greeting() -> str | None:
                    try:
                        reader, writer = await asyncio.open_connection(router_ip, 9000)
                    except OSError:
                        return None
                    try:
                        line = await asyncio.wait_for(reader.readline(), 5)
                    except (OSError, TimeoutError):
                        return None
                    finally:
                        writer.close()
                    return line.decode().strip() or None

                assert await eventually(greeting, timeout=30, what="TCPRoute served") == "db"
                verified = client_context(root)
                cert, status, body = await tls_get(router_ip, 9443, "pass.example.com", verified)
                assert cert.serial_number == issued.serial
                assert (status, body) == (200, "tlsbackend")
                # Another SNI has no route: the router closes the connection.
                assert await refused(router_ip, 9443, "other.example.com", verified)
            finally:
                assert router.terminate() == 0, router.log()[-3000:]
    finally:
        await tls_backend.close()
        await tcp_backend.close()


async def test_kubernetes_mode_routes_and_writes_status(tmp_path: Path) -> None:
    """The same path from the Kubernetes API: the Gateway API objects and the backend's Pod
    come from the in-test API server, the route's status is written back there, and a
    ReferenceGrant created later lets the router serve the other namespace's route."""
    backend_ip, router_ip = pod_ip(), pod_ip()
    app = EchoApp("v1", backend_ip, APP_PORT)
    await app.start()
    try:
        async with FakeKubeApi(bookmark_interval=0.2) as api:
            kubeconfig = tmp_path / "kubeconfig"
            kubeconfig.write_text(api.kubeconfig())
            for name in ("infra", "apps"):
                api.put(
                    {
                        "apiVersion": "v1",
                        "kind": "Namespace",
                        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
                    }
                )
            api.put(_service("v1", "infra"))
            api.put(kube_pod("v1-0", backend_ip, {"app": "v1"}, namespace="infra"))
            api.put(gateway_class())
            api.put(gateway(listeners=[listener("http", GATEWAY_PORT, from_="All")]))
            guest = _cross_namespace_route()
            guest["spec"]["rules"] = [{"backendRefs": [backend("v1", namespace="infra")]}]
            api.put(guest)
            async with running_kube_control_plane(kubeconfig) as cp:
                router = _router(cp, tmp_path, router_ip)
                url = f"http://{router_ip}:{GATEWAY_PORT}/"
                try:

                    def reasons() -> dict[str, str]:
                        obj = api.objects[f"httproutes.{GROUP}"][("apps", "guest")]
                        parents = (obj.get("status") or {}).get("parents") or []
                        if not parents:
                            return {}
                        return {c["type"]: c["reason"] for c in parents[0]["conditions"]}

                    await eventually(
                        lambda: reasons().get("ResolvedRefs") == "RefNotPermitted",
                        what="RefNotPermitted in the API server",
                    )
                    async with aiohttp.ClientSession() as session:

                        async def guest_status() -> int:
                            try:
                                status, _, _ = await _get(session, url, "guest.example.com")
                            except aiohttp.ClientError:
                                return 0
                            return status

                        await eventually(
                            lambda: _is(guest_status(), 500), timeout=30, what="router up, 500"
                        )
                        api.put(reference_grant("apps-to-infra", "infra", "apps"))
                        await eventually(
                            lambda: reasons().get("ResolvedRefs") == "ResolvedRefs",
                            what="ResolvedRefs in the API server",
                        )
                        await eventually(
                            lambda: _is(guest_status(), 200), what="guest route served"
                        )
                        _, body, _ = await _get(session, url, "guest.example.com")
                        assert body["app"] == "v1"
                    gw = api.objects[f"gateways.{GROUP}"][("infra", "gw")]["status"]
                    assert gw["listeners"][0]["attachedRoutes"] == 1
                finally:
                    assert router.terminate() == 0, router.log()[-3000:]
    finally:
        await app.close()


async def _is(call: Any, want: int) -> bool:
    return bool(await call == want)
