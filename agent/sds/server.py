"""The SDS gRPC server on `<workdir>/SDS`: Envoy's `sds-grpc` cluster (agent/envoy/bootstrap.py)
reads the workload certificate and the root from here, and a gateway its certificates
(`kubernetes://…`, fetched from the control plane: remote.py). A secret the control plane
refuses ends the stream (or the fetch) with the control plane's status, PERMISSION_DENIED.

`envoy.service.secret.v3.SecretDiscoveryService`: StreamSecrets (SotW, rules in stream.py)
and FetchSecrets (unary). DeltaSecrets is not served (gRPC answers UNIMPLEMENTED); Envoy uses
it only when told to. The socket hands out private keys, so it is created 0600 inside a
private directory and then moved into place: no other user can connect, not even during
the moment between bind and chmod.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest, DiscoveryResponse
from google.protobuf.message import DecodeError

from agent.sds.names import FileSecretError
from agent.sds.resources import view_version
from agent.sds.secrets import SecretManager
from agent.sds.stream import RequestKind, SdsProtocolError, SdsStream
from agent.unixsocket import UnixGrpcServer, UnixService, sds_socket_server
from protos import typeurls
from protos.rawcalls import bytes_in

logger = logging.getLogger(__name__)

SERVICE = "envoy.service.secret.v3.SecretDiscoveryService"


class SdsServer(UnixService):
    label = "SDS server"

    def __init__(
        self,
        socket_path: Path,
        secrets: SecretManager,
        *,
        fetch_timeout: float = 10.0,
        owner: int | None = None,
        server: UnixGrpcServer | None = None,
    ) -> None:
        """`owner`: the UID that may connect (Envoy's, when it runs as another user than the
        agent); the socket stays 0600, owned by that user. `server`: the socket, when it
        was bound beforehand (agent/launch.py)."""
        super().__init__(socket_path, server or sds_socket_server(socket_path, owner))
        self._secrets = secrets
        self._fetch_timeout = fetch_timeout
        self._ids = itertools.count(1)
        self.active = 0  # open StreamSecrets streams

    def _handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "StreamSecrets": bytes_in(
                    grpc.stream_stream_rpc_method_handler, self._stream, DiscoveryResponse
                ),
                "FetchSecrets": bytes_in(
                    grpc.unary_unary_rpc_method_handler, self._fetch_raw, DiscoveryResponse
                ),
            },
        )

    # --- StreamSecrets ---------------------------------------------------------------------

    async def _stream(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> None:
        sid = next(self._ids)
        state = SdsStream()
        # One queue carries both requests and change notices, so the stream's state is only
        # ever touched by this task. None: the client closed its side; an exception: its
        # request could not be decoded.
        events: asyncio.Queue[DiscoveryRequest | str | DecodeError | None] = asyncio.Queue()

        def on_change(name: str) -> None:
            if name in state.names:
                events.put_nowait(name)

        unwatch = self._secrets.watch(on_change)
        reader = asyncio.create_task(_read(requests, events), name=f"sds-{sid}-reader")
        held: set[str] = set()
        self.active += 1
        logger.debug("SDS stream %d opened", sid)
        try:
            while (event := await events.get()) is not None:
                force = False
                if isinstance(event, DecodeError):
                    logger.info("SDS stream %d: malformed request: %s", sid, event)
                    await context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {event}"
                    )
                    return
                if isinstance(event, DiscoveryRequest):
                    try:
                        outcome = state.receive(event)
                    except SdsProtocolError as e:
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                        return
                    if outcome.kind is RequestKind.NACK:
                        logger.warning(
                            "SDS stream %d: Envoy rejected %s: %s",
                            sid,
                            sorted(state.names),
                            outcome.error_message,
                        )
                    await self._hold(sid, outcome.added, held)
                    for name in outcome.removed & held:
                        held.discard(name)
                        self._secrets.release(name)
                    force = outcome.must_respond
                refused = self._refusal(state.names)
                if refused is not None:
                    # Not ours to serve (a sidecar asking for a gateway certificate, a
                    # gateway of another namespace): Envoy logs the status and retries. The
                    # refusal itself was logged once, as a warning, when it came (remote.py).
                    name, (code, message) = refused
                    logger.info("SDS stream %d: %s refused: %s", sid, name, message)
                    await context.abort(code, f"{name}: {message}")
                    return
                response = state.respond(self._secrets.entries(), force=force)
                if response is not None:
                    logger.debug(
                        "SDS stream %d: sending %s version %s",
                        sid,
                        response.names,
                        response.version_info,
                    )
                    await context.write(response.to_proto())
        finally:
            reader.cancel()
            unwatch()
            for name in held:
                self._secrets.release(name)
            self.active -= 1
            logger.debug("SDS stream %d closed", sid)

    def _refusal(
        self, names: frozenset[str] | list[str]
    ) -> tuple[str, tuple[grpc.StatusCode, str]] | None:
        for name in sorted(names):
            refusal = self._secrets.refusal(name)
            if refusal is not None:
                return name, refusal
        return None

    async def _hold(self, sid: int, names: frozenset[str], held: set[str]) -> None:
        for name in sorted(names - held):
            try:
                self._secrets.check(name)
                await self._secrets.acquire(name)
            except FileSecretError as e:
                # Stays subscribed and is never sent; Envoy's own init timeout reports it.
                logger.warning("SDS stream %d: %s", sid, e)
                continue
            held.add(name)

    # --- FetchSecrets ----------------------------------------------------------------------

    async def _fetch_raw(self, raw: bytes, context: grpc.aio.ServicerContext) -> DiscoveryResponse:
        try:
            request = DiscoveryRequest.FromString(raw)
        except DecodeError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {e}")
            raise  # not reached: abort raises
        return await self._fetch(request, context)

    async def _fetch(
        self, request: DiscoveryRequest, context: grpc.aio.ServicerContext
    ) -> DiscoveryResponse:
        if request.type_url and request.type_url != typeurls.SECRET:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"SDS serves {typeurls.SECRET}, not {request.type_url!r}",
            )
        names = sorted(set(request.resource_names))
        if not names:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no resource_names requested")
        for name in names:
            try:
                self._secrets.check(name)
            except FileSecretError as e:
                await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        held: list[str] = []
        try:
            for name in names:
                await self._secrets.acquire(name)
                held.append(name)
            missing = await self._wait_for(names, _time_remaining(context, self._fetch_timeout))
            refused = self._refusal(names)
            if refused is not None:
                name, (code, message) = refused
                await context.abort(code, f"{name}: {message}")
            if missing:
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE, f"secrets not available yet: {missing}"
                )
            entries = self._secrets.entries()
            view = tuple(entries[n] for n in names)
            return DiscoveryResponse(
                version_info=view_version(view),
                type_url=typeurls.SECRET,
                resources=[e.resource for e in view],
            )
        finally:
            for name in held:
                self._secrets.release(name)

    async def _wait_for(self, names: list[str], timeout: float) -> list[str]:
        """Wait until every name can be served; the ones still missing after `timeout`."""
        changed = asyncio.Event()
        unwatch = self._secrets.watch(lambda _name: changed.set())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while missing := [n for n in names if n not in self._secrets.entries()]:
                if self._refusal(missing) is not None:
                    return missing
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return missing
                changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):  # wait_for could lose a cancel
                        await changed.wait()
            return []
        finally:
            unwatch()


async def _read(
    requests: AsyncIterator[bytes],
    events: asyncio.Queue[DiscoveryRequest | str | DecodeError | None],
) -> None:
    try:
        async for raw in requests:
            try:
                events.put_nowait(DiscoveryRequest.FromString(raw))
            except DecodeError as e:
                events.put_nowait(e)  # the stream ends with it; nothing after it is read
                return
    except grpc.aio.AioRpcError:
        pass  # the client went away: same as a clean end
    finally:
        events.put_nowait(None)


def _time_remaining(context: grpc.aio.ServicerContext, cap: float) -> float:
    """The caller's deadline (a little before it, to answer in time), at most `cap`."""
    remaining = context.time_remaining()
    if remaining is None:
        return cap
    return max(0.0, min(cap, float(remaining) - 0.1))
