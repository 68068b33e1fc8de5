"""A plaintext grpc.aio server for receivers that tests write (collectors, log services): the
services are registered by hand (generic handlers), so no generated service stubs are needed."""

from __future__ import annotations

import grpc


async def start_generic_server(
    host: str, *handlers: grpc.GenericRpcHandler
) -> tuple[grpc.aio.Server, int]:
    """A started server on `host` (an ephemeral port) with `handlers`; and its port."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(handlers)
    port = server.add_insecure_port(f"{host}:0")
    await server.start()
    return server, port
