"""App probe rewriting end to end, with real sockets: a pod with HTTP, TCP and gRPC probes
goes through the control plane's real injection webhook (HTTPS AdmissionReview); the probes
come back rewritten to the agent's status port and the originals in ISTIO_KUBE_APP_PROBERS;
a real `pilotfish-agent` started with that env then answers the kubelet's
`/app-health/<container>/<kind>` by running the originals against real apps at the pod IP: an
HTTP server (its status passed through), a TCP listener and a grpcio health server."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from aiohttp import web
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from control.app import ControlPlane, ControlPlaneOptions
from control.webhook.jsonpatch import apply_patch
from tests.support.admission import admission_review
from tests.support.agentproc import ROOT, AgentProcess
from tests.support.controlplane import eventually
from tests.support.net import free_port, pod_ip
from tests.support.testca import TestCA

HTTP_PORT, TCP_PORT, GRPC_PORT, HTTPS_PORT = 8080, 7070, 9090, 8443


def probed_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "web-",
            "labels": {"app": "web", "sidecar.istio.io/inject": "true"},
        },
        "spec": {
            "containers": [
                {
                    "name": "web",
                    "image": "web:1",
                    "ports": [{"name": "http", "containerPort": HTTP_PORT}],
                    "readinessProbe": {
                        "httpGet": {
                            "path": "/ready",
                            "port": "http",
                            "httpHeaders": [{"name": "X-Probe", "value": "kubelet"}],
                        },
                        "periodSeconds": 3,
                        "timeoutSeconds": 2,
                    },
                    "livenessProbe": {"tcpSocket": {"port": TCP_PORT}, "failureThreshold": 5},
                    "startupProbe": {"exec": {"command": ["true"]}},
                },
                {
                    "name": "secure",
                    "image": "secure:1",
                    "readinessProbe": {
                        "httpGet": {"path": "/ready", "port": HTTPS_PORT, "scheme": "HTTPS"}
                    },
                },
                {
                    "name": "api",
                    "image": "api:1",
                    "readinessProbe": {"grpc": {"port": GRPC_PORT}},
                    "startupProbe": {"grpc": {"port": GRPC_PORT, "service": "api.v1.Api"}},
                },
            ]
        },
    }


async def injected(cp: ControlPlane, pod: dict[str, Any]) -> dict[str, Any]:
    response = await admission_review(cp, pod)
    assert response["allowed"] is True and response["patchType"] == "JSONPatch", response
    return apply_patch(pod, json.loads(base64.b64decode(response["patch"])))


@contextlib.asynccontextmanager
async def webhook(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    opts = ControlPlaneOptions(
        config_paths=(str(cfg),),
        xds_address="127.0.0.1:0",
        http_address="127.0.0.1:0",
        webhook_address="127.0.0.1:0",
    )
    async with ControlPlane(opts) as cp:
        yield cp


class HttpApp:
    """Answers GET /ready with `status`; records the headers it was probed with."""

    def __init__(self) -> None:
        self.status = 200
        self.headers: dict[str, str] = {}
        self.runner: web.AppRunner | None = None

    async def _ready(self, request: web.Request) -> web.Response:
        self.headers = dict(request.headers)
        return web.Response(status=self.status, text=f"app says {self.status}")

    async def start(
        self, ip: str, port: int = HTTP_PORT, tls: ssl.SSLContext | None = None
    ) -> None:
        app = web.Application()
        app.router.add_get("/ready", self._ready)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, ip, port, ssl_context=tls).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


async def status_of(url: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s,
        s.get(url, headers={"User-Agent": "kube-probe/1.31"}) as r,
    ):
        return r.status, await r.text()


async def test_rewritten_probes_answered_by_a_real_agent(tmp_path: Path) -> None:
    async with webhook(tmp_path) as cp:
        out = await injected(cp, probed_pod())
    web_c, secure_c, api_c, proxy = out["spec"]["containers"]
    assert proxy["name"] == "istio-proxy"
    # The kubelet now probes the agent; the probe's timing fields are kept.
    assert web_c["readinessProbe"] == {
        "httpGet": {
            "path": "/app-health/web/readyz",
            "port": 15020,
            "httpHeaders": [{"name": "X-Probe", "value": "kubelet"}],
        },
        "periodSeconds": 3,
        "timeoutSeconds": 2,
    }
    assert web_c["livenessProbe"] == {
        "httpGet": {"path": "/app-health/web/livez", "port": 15020},
        "failureThreshold": 5,
    }
    assert web_c["startupProbe"] == {"exec": {"command": ["true"]}}  # exec: left alone
    assert api_c["readinessProbe"] == {"httpGet": {"path": "/app-health/api/readyz", "port": 15020}}
    # HTTPS to the app, plain HTTP from the kubelet to the agent.
    assert secure_c["readinessProbe"] == {
        "httpGet": {"path": "/app-health/secure/readyz", "port": 15020}
    }
    env = {e["name"]: e.get("value") for e in proxy["env"]}
    probers = json.loads(env["ISTIO_KUBE_APP_PROBERS"])
    assert probers == {
        "/app-health/web/readyz": {
            "httpGet": {
                "path": "/ready",
                "port": HTTP_PORT,  # the named port, resolved
                "httpHeaders": [{"name": "X-Probe", "value": "kubelet"}],
            },
            "timeoutSeconds": 2,
        },
        "/app-health/web/livez": {"tcpSocket": {"port": TCP_PORT}},
        "/app-health/secure/readyz": {
            "httpGet": {"path": "/ready", "port": HTTPS_PORT, "scheme": "HTTPS"}
        },
        "/app-health/api/readyz": {"grpc": {"port": GRPC_PORT}},
        "/app-health/api/startupz": {"grpc": {"port": GRPC_PORT, "service": "api.v1.Api"}},
    }

    ip = pod_ip()
    status_port = free_port(ip)
    http_app = HttpApp()
    await http_app.start(ip)
    # HTTPS with a certificate the agent does not trust: probes do not verify (Kubernetes').
    cert, key = (
        TestCA().client_cert("spiffe://cluster.local/ns/shop/sa/secure").write(tmp_path, "secure")
    )
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    https_app = HttpApp()
    await https_app.start(ip, HTTPS_PORT, tls)
    tcp = socket.create_server((ip, TCP_PORT))
    health_servicer = health.aio.HealthServicer()
    grpc_server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, grpc_server)
    grpc_server.add_insecure_port(f"{ip}:{GRPC_PORT}")
    await grpc_server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set("api.v1.Api", health_pb2.HealthCheckResponse.NOT_SERVING)
    agent = AgentProcess(
        f"127.0.0.1:{free_port()}",  # no control plane needed for the app probes
        tmp_path / "agent",
        ip,
        "web-1",
        "app=web",
        "--proxy-only",
        "--dns-port",
        "0",
        "--status-port",
        str(status_port),
        env={"ISTIO_KUBE_APP_PROBERS": env["ISTIO_KUBE_APP_PROBERS"]},
    )
    agent.start()
    base = f"http://{ip}:{status_port}"
    try:

        async def up() -> bool:
            try:
                return (await status_of(base + "/app-health/web/livez"))[0] == 200
            except aiohttp.ClientError:
                return False

        await eventually(up, 20, 0.1, what="agent status server answering for the app")
        # HTTP: the app's status and body come through; the probe's header and the
        # kubelet's User-Agent reached the app, with Host naming the app's port.
        assert await status_of(base + "/app-health/web/readyz") == (200, "app says 200")
        assert http_app.headers["X-Probe"] == "kubelet"
        assert http_app.headers["User-Agent"] == "kube-probe/1.31"
        assert http_app.headers["Host"] == f"{ip}:{HTTP_PORT}"
        http_app.status = 500
        assert await status_of(base + "/app-health/web/readyz") == (500, "app says 500")
        await http_app.stop()
        status, text = await status_of(base + "/app-health/web/readyz")
        assert status == 503 and "HTTP GET" in text, text
        assert await status_of(base + "/app-health/secure/readyz") == (200, "app says 200")
        https_app.status = 503
        assert (await status_of(base + "/app-health/secure/readyz"))[0] == 503
        # TCP: a listener is up, then gone.
        tcp.close()
        status, text = await status_of(base + "/app-health/web/livez")
        assert status == 503 and "TCP connect" in text, text
        # gRPC: the standard health service, per service name.
        assert await status_of(base + "/app-health/api/readyz") == (200, "OK\n")
        status, text = await status_of(base + "/app-health/api/startupz")
        assert status == 503 and "NOT_SERVING" in text, text
        await health_servicer.set("api.v1.Api", health_pb2.HealthCheckResponse.SERVING)
        assert (await status_of(base + "/app-health/api/startupz"))[0] == 200
        # A path without a prober is not found; the exec probe was never handed over.
        assert (await status_of(base + "/app-health/web/startupz"))[0] == 404
    finally:
        assert agent.terminate() == 0, agent.log()
        tcp.close()
        await http_app.stop()
        await https_app.stop()
        await grpc_server.stop(None)
    assert "Traceback" not in agent.log(), agent.log()


def test_bad_app_probers_env_is_one_error_at_start(tmp_path: Path) -> None:
    for value, expected in (
        ("{not json", "ISTIO_KUBE_APP_PROBERS: not valid JSON"),
        ('{"/app-health/web/readyz": {"exec": {}}}', "unsupported field exec"),
        ('{"/healthz/web": {"tcpSocket": {"port": 80}}}', "not a path /app-health/"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "agent", "--workdir", str(tmp_path / "w"), "--proxy-only"],
            cwd=ROOT,
            env={**os.environ, "ISTIO_KUBE_APP_PROBERS": value},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, proc.stderr
        assert expected in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
