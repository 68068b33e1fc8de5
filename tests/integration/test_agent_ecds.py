"""ECDS through the agent's relay (issue 24): a real control plane serves a Wasm filter's
TypedExtensionConfig with remote code; the agent fetches the module from a real HTTP server,
and the downstream stream gets the config with the code as a local file. A module that does
not match its sha256 is NACKed by the agent (the reason in the control plane's syncz) and
never reaches the downstream.

The control plane has no config kind that makes ECDS yet (Istio's WasmPlugin), so the test
adds a generator for the type to the real server's table; everything else is the real path.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from aiohttp import web
from envoy.config.core.v3.extension_pb2 import TypedExtensionConfig
from envoy.extensions.filters.http.wasm.v3.wasm_pb2 import Wasm
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest

from agent.xdsproxy.ecds import EXTENSION_CONFIG, ExtensionConfigRewriter, fetch_http
from agent.xdsproxy.handlers import HandlerRegistry
from control import generate
from control.app import ControlPlane
from control.generate.context import GenContext
from control.model.proxy import Proxy as ProxyModel
from control.xds.cache import ResourceSet
from tests.integration.test_agent_xdsproxy import MESH, Proxy, sotw_request
from tests.support.adsclient import AdsStream
from tests.support.controlplane import eventually, running_control_plane
from tests.support.net import pod_ip
from tests.unit.test_ecds import wasm_config

MODULE = b"\x00asm\x01\x00\x00\x00" + bytes(range(256)) * 64
SHA = hashlib.sha256(MODULE).hexdigest()


@pytest.fixture
async def module_url() -> AsyncIterator[str]:
    app = web.Application()

    async def serve(request: web.Request) -> web.Response:
        return web.Response(body=MODULE, content_type="application/wasm")

    app.router.add_get("/filter.wasm", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    ip = pod_ip()
    site = web.TCPSite(runner, ip, 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://{ip}:{port}/filter.wasm"
    finally:
        await runner.cleanup()


@pytest.fixture
async def cp(
    tmp_path: Path, module_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[ControlPlane]:
    configs = {
        "default.stats": wasm_config("default.stats", module_url, SHA),
        "default.tampered": wasm_config("default.tampered", module_url, "0" * 64),
    }

    def ecds(ctx: GenContext, proxy: ProxyModel) -> ResourceSet:
        return ResourceSet(
            [
                ctx.resource(EXTENSION_CONFIG, name, ("ecds", name), lambda c=c: c)
                for name, c in configs.items()
            ]
        )

    monkeypatch.setitem(generate.GENERATORS, EXTENSION_CONFIG, ecds)
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    async with running_control_plane(cfg) as cp:
        yield cp


def agent_handlers(workdir: Path) -> HandlerRegistry:
    """The registry as the agent wires it for ECDS (agent/app.py)."""
    handlers = HandlerRegistry()
    handlers.fetchers["http"] = fetch_http
    handlers.rewriters[EXTENSION_CONFIG] = ExtensionConfigRewriter(
        workdir / "wasm", handlers.fetchers
    )
    return handlers


async def test_remote_wasm_code_reaches_the_downstream_as_a_local_file(
    cp: ControlPlane, tmp_path: Path
) -> None:
    handlers = agent_handlers(tmp_path)
    async with Proxy(cp, tmp_path, handlers) as proxy:
        async with grpc.aio.insecure_channel(f"unix:{tmp_path / 'XDS'}") as local:
            envoy = AdsStream(local)
            await envoy.send(sotw_request(EXTENSION_CONFIG, "127.8.1.1", ["default.stats"]))
            resp = await envoy.recv(timeout=20)
            (config,) = [TypedExtensionConfig.FromString(a.value) for a in resp.resources]
            code = Wasm.FromString(config.typed_config.value).config.vm_config.code
            assert code.WhichOneof("specifier") == "local"
            path = Path(code.local.filename)
            assert path == tmp_path / "wasm" / f"{SHA}.wasm"
            assert path.read_bytes() == MODULE
            await envoy.send(
                DiscoveryRequest(
                    type_url=EXTENSION_CONFIG,
                    version_info=resp.version_info,
                    response_nonce=resp.nonce,
                    resource_names=["default.stats"],
                )
            )

            def synced() -> bool:
                return any(
                    e["types"].get(EXTENSION_CONFIG, {}).get("status") == "SYNCED"
                    for e in cp.views.syncz()
                )

            await eventually(synced, what="ECDS ACKed by the downstream")
            assert proxy.stats.nacks == 0
            await envoy.close()


async def test_a_module_that_does_not_match_its_sha256_is_nacked_by_the_agent(
    cp: ControlPlane, tmp_path: Path
) -> None:
    handlers = agent_handlers(tmp_path)
    async with Proxy(cp, tmp_path, handlers) as proxy:
        async with grpc.aio.insecure_channel(f"unix:{tmp_path / 'XDS'}") as local:
            envoy = AdsStream(local)
            await envoy.send(sotw_request(EXTENSION_CONFIG, "127.8.1.2", ["default.tampered"]))

            def nacked() -> str:
                for entry in cp.views.syncz():
                    row = entry["types"].get(EXTENSION_CONFIG)
                    if row and row["status"] == "ERROR":
                        return str(row["last_nack"])
                return ""

            message = await eventually(nacked, timeout=20, what="ECDS NACK in syncz")
            assert f"sha256 {SHA}, the config says {'0' * 64}" in message
            assert proxy.stats.nacks == 1
            assert not (tmp_path / "wasm" / f"{'0' * 64}.wasm").exists()
            # The downstream never saw the config it could not have run (the relay writes a
            # response downstream before it queues the upstream answer, so had it forwarded
            # this one, it would be here by the time the NACK is in syncz).
            assert envoy.responses.empty()
            await envoy.close()
