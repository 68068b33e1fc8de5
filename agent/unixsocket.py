"""The agent's local gRPC servers on Unix sockets in the workdir (`XDS`, `SDS`, `ALS`): binding
them privately and stopping them without hanging (`UnixGrpcServer` does both), and the base of
the services served on them (`UnixService`)."""

from __future__ import annotations

import contextlib
import logging
import os
from abc import abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import grpc

from pilotfish_common.grpcserver import stop_bounded
from pilotfish_common.lifecycle import Lifecycle

logger = logging.getLogger(__name__)

# sockaddr_un.sun_path holds 108 bytes, the terminating NUL included.
MAX_SOCKET_PATH = 107


def bind_private(server: grpc.aio.Server, path: Path, mode: int, owner: int | None = None) -> None:
    """Listen on `path` with `mode` (and owned by UID `owner` when given), with no moment at
    which the socket is reachable with looser permissions: it is bound inside a fresh 0700
    directory, chmod-ed there, then moved into place (blocking, a few syscalls; call once at
    startup)."""
    path = path.absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a stale socket from a previous run
    private = _private_dir(path)
    try:
        tmp = private / path.name
        if len(str(tmp)) > MAX_SOCKET_PATH:
            # The private directory makes the path too long for a socket address: bind in
            # place (the window before chmod is the only difference).
            server.add_insecure_port(f"unix:{path}")
            _restrict(path, mode, owner)
        else:
            server.add_insecure_port(f"unix:{tmp}")
            _restrict(tmp, mode, owner)
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            private.rmdir()


def _private_dir(path: Path) -> Path:
    """A fresh 0700 directory beside `path`, as tempfile.mkdtemp makes one: not with it,
    because tempfile imports shutil and with it bz2 and lzma, ~2 ms of the agent's start
    (before Envoy's launcher) and their memory for the agent's life."""
    private = path.parent / f".{path.name}{os.urandom(12).hex()}"  # 96 bits: no retry
    os.mkdir(private, 0o700)
    return private


def _restrict(path: Path, mode: int, owner: int | None) -> None:
    os.chmod(path, mode)
    if owner is not None:
        os.chown(path, owner, -1)


# Envoy pings the agent every 30 s on its ADS, SDS and ALS connections (the bootstrap's
# `connection_keepalive`), through streams that are idle for as long as nothing changes. A gRPC
# server's default ping policy (a ping without data at most every 5 minutes, hang up on the
# third sooner) answered the fourth ping with GOAWAY `too_many_pings`: Envoy's ADS and SDS
# connections were cut every ~2 minutes and it fetched every resource again. The policy guards
# a server against remote clients flooding it with pings; these sockets are private to the pod
# and their one client is its Envoy, whose ping interval the user may change, so a ping is
# never a reason to hang up.
_PING_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.http2.max_ping_strikes", 0),  # 0: no limit
    ("grpc.keepalive_permit_without_calls", 1),
]


class UnixGrpcServer:
    """A grpc.aio server on one private Unix socket: `start(handler)`, `close()`. The socket
    file is removed on close.

    `bind()` may come first, on its own: the socket then exists and listens (the kernel
    queues connections) before the handler exists. The agent binds its sockets that way
    before its heavy imports and starts Envoy at once, so Envoy's first connection waits in
    the queue until `start()` instead of failing into Envoy's reconnect backoff."""

    def __init__(
        self,
        path: Path,
        mode: int,
        *,
        owner: int | None = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.path = path
        self._mode = mode
        self._owner = owner
        self._options = [*_PING_OPTIONS, *options]
        self._server: grpc.aio.Server | None = None
        self._started = False

    def bind(self) -> None:
        """Create the socket (idempotent; a few syscalls once at startup, and gRPC binds
        synchronously anyway)."""
        if self._server is None:
            server = grpc.aio.server(options=self._options)
            bind_private(server, self.path, self._mode, self._owner)
            self._server = server

    async def start(self, handler: grpc.GenericRpcHandler) -> None:
        self.bind()
        assert self._server is not None
        self._server.add_generic_rpc_handlers((handler,))
        await self._server.start()
        self._started = True

    async def close(self, grace: float) -> None:
        if self._server is not None:
            if self._started:
                await stop_bounded(self._server, grace, "local gRPC server")
            else:  # bound, never served: nothing to drain
                await self._server.stop(None)
            self._server = None
            self._started = False
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class UnixService(Lifecycle):
    """A gRPC service on one of the agent's sockets (xDS proxy, SDS, access logs): `start()`
    serves `_handler()` on `server`, `close(grace)` stops it and removes the socket. What a
    subclass adds is its handler and the state its calls share."""

    label: ClassVar[str]  # what the log calls it: "SDS server", …

    def __init__(self, socket_path: Path, server: UnixGrpcServer) -> None:
        self.socket_path = socket_path
        self._server = server

    @abstractmethod
    def _handler(self) -> grpc.GenericRpcHandler:
        """The service's methods (built once, at `start()`)."""

    async def start(self) -> None:
        await self._server.start(self._handler())
        # The subclass's module logger: the line is filed under the service, as it was when
        # each server logged it itself.
        logging.getLogger(type(self).__module__).info(
            "%s listening on %s", self.label, self.socket_path
        )

    async def close(self, grace: float = 0.5) -> None:
        await self._server.close(grace)


# The agent's three sockets: who may connect and what they carry.


def xds_socket_server(path: Path) -> UnixGrpcServer:
    """`<workdir>/XDS`: only this pod's processes (same user or group) may talk to the
    control plane as us."""
    return UnixGrpcServer(
        path,
        0o660,
        options=[
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 256 << 20),
        ],
    )


def sds_socket_server(path: Path, owner: int | None = None) -> UnixGrpcServer:
    """`<workdir>/SDS` hands out private keys: 0600, owned by `owner` (Envoy's UID when it
    runs as another user than the agent)."""
    return UnixGrpcServer(path, 0o600, owner=owner)


# Envoy batches up to LOG_BUFFER (control/generate/telemetry_metrics.py) per message.
ALS_MAX_MESSAGE = 16 << 20


def als_socket_server(path: Path, owner: int | None = None) -> UnixGrpcServer:
    """`<workdir>/ALS`: Envoy's access log stream (the standard metrics)."""
    return UnixGrpcServer(
        path, 0o600, owner=owner, options=[("grpc.max_receive_message_length", ALS_MAX_MESSAGE)]
    )
