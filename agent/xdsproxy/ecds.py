"""Extension config discovery (ECDS) through the agent: Wasm code from a remote source becomes
a local file before Envoy sees the config, as Istio's agent does (Envoy then never fetches
code over the network itself, and a module is fetched once per pod, not per listener).

ECDS responses (`envoy.config.core.v3.TypedExtensionConfig`) are relayed to Envoy like any
other type. Only when one carries an HTTP or network Wasm filter whose `vm_config.code` is
`remote` does the relay rewrite it: the module is fetched (by URI scheme: `http` built in, any
other scheme from a plug-in's `registry.register_fetcher(scheme, fetch)`), checked against
its sha256, kept in `<workdir>/wasm/<sha256>.wasm`, and the code source becomes `local`
with that file name. A module that cannot be fetched or does not match its sha256 NACKs the
response (the reason shows in the control plane's syncz) and Envoy keeps what it had.
Responses without remote code are forwarded as the exact bytes received.

`remote_code` and `localized` are the decisions (pure); `ExtensionConfigRewriter` does the
I/O (fetches, files in a thread).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryResponse, DiscoveryResponse
from google.protobuf.message import DecodeError, Message

from agent.httpio import HttpClientError, fetch
from agent.xdsproxy.handlers import HandlerError
from protos import typeurls
from protos.messages import message_class

logger = logging.getLogger(__name__)

EXTENSION_CONFIG = typeurls.EXTENSION_CONFIG
# Looked up (imported) on the first ECDS response, not at the agent's start.
WASM_TYPES = frozenset(
    (
        "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
        "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm",
    )
)
# Wasm modules are megabytes; more than this from one URI is not a module.
MAX_MODULE_BYTES = 64 << 20

Fetch = Callable[[str], Awaitable[bytes]]


@dataclass(frozen=True)
class RemoteCode:
    uri: str
    sha256: str  # lower-case hex; "" when the config gives none


def _config_class() -> Any:
    return message_class(EXTENSION_CONFIG)


def remote_code(config: Any) -> RemoteCode | None:
    """The remote Wasm module `config` (a TypedExtensionConfig) needs, or None (not Wasm, or
    its code is already local)."""
    if config.typed_config.type_url not in WASM_TYPES:
        return None
    wasm: Any = message_class(config.typed_config.type_url).FromString(config.typed_config.value)
    code = wasm.config.vm_config.code
    if code.WhichOneof("specifier") != "remote":
        return None
    return RemoteCode(code.remote.http_uri.uri, code.remote.sha256.lower())


def localized(config: Any, path: Path) -> Message:
    """`config` with its Wasm code read from `path` instead of its remote source."""
    wasm: Any = message_class(config.typed_config.type_url).FromString(config.typed_config.value)
    wasm.config.vm_config.code.local.filename = str(path)  # the oneof drops `remote`
    out: Any = _config_class()()
    out.CopyFrom(config)
    out.typed_config.value = wasm.SerializeToString()
    return out


async def fetch_http(uri: str) -> bytes:
    status, body = await fetch(uri, timeout=30.0)
    if status != 200:
        raise HandlerError(f"fetching {uri}: HTTP {status}")
    return body


class ExtensionConfigRewriter:
    def __init__(self, cache_dir: Path, fetchers: Mapping[str, Fetch]) -> None:
        """`fetchers`: by URI scheme; read at each fetch, so plug-ins may add to it later."""
        self.cache_dir = cache_dir
        self._fetchers = fetchers
        self._locks: dict[str, asyncio.Lock] = {}
        self.fetched = 0

    async def rewrite(self, raw: bytes, *, delta: bool) -> bytes | None:
        """The response to forward instead of `raw`, or None to forward `raw` as it is.
        Raises HandlerError (the relay NACKs) when a module cannot be had."""
        try:
            if delta:
                return await self._rewrite_delta(DeltaDiscoveryResponse.FromString(raw))
            return await self._rewrite_sotw(DiscoveryResponse.FromString(raw))
        except DecodeError as e:
            raise HandlerError(f"cannot decode the ECDS response: {e}") from None

    async def _rewrite_sotw(self, resp: DiscoveryResponse) -> bytes | None:
        changed = False
        for any_ in resp.resources:
            config = _config_class().FromString(any_.value)
            new = await self._localize(config)
            if new is not None:
                any_.value = new.SerializeToString()
                changed = True
        return _bytes(resp) if changed else None

    async def _rewrite_delta(self, resp: DeltaDiscoveryResponse) -> bytes | None:
        changed = False
        for res in resp.resources:
            if not res.HasField("resource"):
                continue
            config = _config_class().FromString(res.resource.value)
            new = await self._localize(config)
            if new is not None:
                res.resource.value = new.SerializeToString()
                changed = True
        return _bytes(resp) if changed else None

    async def _localize(self, config: Any) -> Message | None:
        code = remote_code(config)
        if code is None:
            return None
        path = await self.module(code)
        logger.debug("ECDS %s: %s served from %s", config.name, code.uri, path)
        return localized(config, path)

    async def module(self, code: RemoteCode) -> Path:
        """The local file of `code`'s module: from the cache, or fetched and checked."""
        lock = self._locks.setdefault(code.uri, asyncio.Lock())
        async with lock:  # one fetch per module, however many listeners use it
            if code.sha256:
                cached = self.cache_dir / f"{code.sha256}.wasm"
                if await asyncio.to_thread(_matches, cached, code.sha256):
                    return cached
            scheme = urlsplit(code.uri).scheme
            fetcher = self._fetchers.get(scheme)
            if fetcher is None:
                raise HandlerError(f"no fetcher for {scheme or 'scheme-less'} URI {code.uri!r}")
            try:
                body = await fetcher(code.uri)
            except HandlerError:
                raise
            except (OSError, TimeoutError, HttpClientError, ValueError) as e:
                raise HandlerError(f"fetching {code.uri}: {e or type(e).__name__}") from None
            if len(body) > MAX_MODULE_BYTES:
                raise HandlerError(f"{code.uri}: more than {MAX_MODULE_BYTES} bytes")
            digest = hashlib.sha256(body).hexdigest()
            if code.sha256 and digest != code.sha256:
                raise HandlerError(f"{code.uri}: sha256 {digest}, the config says {code.sha256}")
            path = self.cache_dir / f"{digest}.wasm"
            await asyncio.to_thread(_write, path, body)
            self.fetched += 1
            return path


def _bytes(msg: DiscoveryResponse | DeltaDiscoveryResponse) -> bytes:
    data: bytes = msg.SerializeToString()
    return data


def _matches(path: Path, sha256: str) -> bool:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() == sha256
    except OSError:
        return False


def _write(path: Path, body: bytes) -> None:
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(body)
    os.replace(tmp, path)  # Envoy never reads a half-written module
