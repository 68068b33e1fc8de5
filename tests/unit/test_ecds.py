"""ECDS through the agent (agent/xdsproxy/ecds.py): which configs need a fetch, the rewrite to
a local file, and the rewriter's cache and checks (fetchers are plain async functions, as a
plug-in's would be)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
from envoy.config.core.v3.extension_pb2 import TypedExtensionConfig
from envoy.extensions.filters.http.router.v3.router_pb2 import Router
from envoy.extensions.filters.http.wasm.v3.wasm_pb2 import Wasm
from envoy.extensions.filters.network.wasm.v3.wasm_pb2 import Wasm as NetworkWasm
from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryResponse, DiscoveryResponse

from agent.xdsproxy.ecds import (
    EXTENSION_CONFIG,
    ExtensionConfigRewriter,
    RemoteCode,
    localized,
    remote_code,
)
from agent.xdsproxy.handlers import HandlerError

MODULE = b"\x00asm\x01\x00\x00\x00"
SHA = hashlib.sha256(MODULE).hexdigest()
URI = "http://wasm.example/filter.wasm"


def wasm_config(
    name: str = "default.stats", uri: str = URI, sha: str = SHA
) -> TypedExtensionConfig:
    wasm = Wasm()
    wasm.config.name = name
    wasm.config.vm_config.runtime = "envoy.wasm.runtime.v8"
    wasm.config.vm_config.code.remote.http_uri.uri = uri
    wasm.config.vm_config.code.remote.http_uri.cluster = "wasm"
    wasm.config.vm_config.code.remote.sha256 = sha
    tec = TypedExtensionConfig(name=name)
    tec.typed_config.Pack(wasm)
    return tec


def sotw(*configs: TypedExtensionConfig) -> bytes:
    resp = DiscoveryResponse(type_url=EXTENSION_CONFIG, version_info="v1", nonce="n1")
    for c in configs:
        resp.resources.add().Pack(c)
    data: bytes = resp.SerializeToString()
    return data


def test_remote_code_is_found_only_in_remote_wasm_configs() -> None:
    assert remote_code(wasm_config()) == RemoteCode(URI, SHA)
    router = TypedExtensionConfig(name="r")
    router.typed_config.Pack(Router())
    assert remote_code(router) is None
    local = localized(wasm_config(), Path("/w/x.wasm"))
    assert remote_code(local) is None
    net = NetworkWasm()
    net.config.vm_config.code.remote.http_uri.uri = URI
    tec = TypedExtensionConfig(name="n")
    tec.typed_config.Pack(net)
    assert remote_code(tec) == RemoteCode(URI, "")


def test_localized_keeps_everything_but_the_code_source() -> None:
    tec = wasm_config()
    out = localized(tec, Path("/w/x.wasm"))
    wasm = Wasm.FromString(out.typed_config.value)  # type: ignore[attr-defined]
    assert wasm.config.vm_config.code.local.filename == "/w/x.wasm"
    assert not wasm.config.vm_config.code.HasField("remote")
    assert wasm.config.name == "default.stats"
    assert wasm.config.vm_config.runtime == "envoy.wasm.runtime.v8"
    assert out.name == tec.name  # type: ignore[attr-defined]
    assert remote_code(tec) == RemoteCode(URI, SHA)  # the input is untouched


def test_rewriter_fetches_once_checks_the_digest_and_rewrites(tmp_path: Path) -> None:
    fetched: list[str] = []

    async def fetch(uri: str) -> bytes:
        fetched.append(uri)
        return MODULE

    rw = ExtensionConfigRewriter(tmp_path / "wasm", {"http": fetch})
    router = TypedExtensionConfig(name="r")
    router.typed_config.Pack(Router())
    assert asyncio.run(rw.rewrite(sotw(router), delta=False)) is None  # forwarded as is

    out = asyncio.run(rw.rewrite(sotw(wasm_config("a"), wasm_config("b"), router), delta=False))
    assert out is not None
    resp = DiscoveryResponse.FromString(out)
    assert (resp.version_info, resp.nonce) == ("v1", "n1")
    configs = [TypedExtensionConfig.FromString(a.value) for a in resp.resources]
    files = [
        Wasm.FromString(c.typed_config.value).config.vm_config.code.local.filename
        for c in configs[:2]
    ]
    assert files == [str(tmp_path / "wasm" / f"{SHA}.wasm")] * 2
    assert Path(files[0]).read_bytes() == MODULE
    assert configs[2] == router
    assert fetched == [URI]  # one fetch for both configs; the next response uses the cache
    asyncio.run(rw.rewrite(sotw(wasm_config("c")), delta=False))
    assert fetched == [URI]

    delta = DeltaDiscoveryResponse(type_url=EXTENSION_CONFIG, nonce="d1")
    delta.resources.add(name="a").resource.Pack(wasm_config("a"))
    delta.removed_resources.append("gone")
    dout = asyncio.run(rw.rewrite(delta.SerializeToString(), delta=True))
    assert dout is not None
    dresp = DeltaDiscoveryResponse.FromString(dout)
    assert list(dresp.removed_resources) == ["gone"]
    local = TypedExtensionConfig.FromString(dresp.resources[0].resource.value)
    assert (
        Wasm.FromString(local.typed_config.value).config.vm_config.code.local.filename == files[0]
    )


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (wasm_config(sha="0" * 64), "sha256 " + SHA),
        (wasm_config(uri="oci://registry/filter:1"), "no fetcher for oci URI"),
        (wasm_config(uri="http://down.example/x.wasm"), "fetching http://down.example/x.wasm"),
    ],
)
def test_a_module_it_cannot_have_is_a_nack_reason(
    tmp_path: Path, config: TypedExtensionConfig, reason: str
) -> None:
    async def fetch(uri: str) -> bytes:
        if "down" in uri:
            raise ConnectionRefusedError("connection refused")
        return MODULE

    rw = ExtensionConfigRewriter(tmp_path / "wasm", {"http": fetch})
    with pytest.raises(HandlerError, match=reason):
        asyncio.run(rw.rewrite(sotw(config), delta=False))
    assert not list((tmp_path / "wasm").glob("0000*"))
    with pytest.raises(HandlerError, match="cannot decode the ECDS response"):
        asyncio.run(rw.rewrite(b"\xff\xff", delta=False))


def test_the_relays_rewriter_is_made_with_the_first_response_and_only_once(
    tmp_path: Path,
) -> None:
    """The relay's ECDS rewriter (agent/relaystart.py) is a stand-in until an ECDS response
    comes; then one real rewriter serves all streams, with the fetchers as given then."""
    from agent.relaystart import LazyEcdsRewriter
    from protos import typeurls

    assert typeurls.EXTENSION_CONFIG == EXTENSION_CONFIG
    fetched: list[str] = []

    async def fetch(uri: str) -> bytes:
        fetched.append(uri)
        return MODULE

    lazy = LazyEcdsRewriter(tmp_path / "wasm", {"http": fetch})
    assert lazy.rewriter is None

    async def two_streams() -> list[bytes | None]:
        return await asyncio.gather(
            lazy.rewrite(sotw(wasm_config("a")), delta=False),
            lazy.rewrite(sotw(wasm_config("b")), delta=False),
        )

    outs = asyncio.run(two_streams())
    assert isinstance(lazy.rewriter, ExtensionConfigRewriter)
    assert all(out is not None for out in outs)
    assert fetched == [URI] and lazy.rewriter.fetched == 1  # one module, one fetch
