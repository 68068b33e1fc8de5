"""Stopping a grpc.aio server without hanging (the agent's Unix-socket servers, the control
plane's xDS/CA ports)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc

logger = logging.getLogger(__name__)


async def stop_bounded(server: grpc.aio.Server, grace: float, what: str = "gRPC server") -> None:
    """`server.stop(grace)`, but never longer than `grace` + 5 s: grpc.aio's shutdown has been
    seen to wait forever on a call that will not finish, and a process that is stopping must
    not hang on it. `what` names the server in the warning."""
    try:
        async with asyncio.timeout(grace + 5.0):
            await server.stop(grace)
    except TimeoutError:
        logger.warning("%s did not stop within %.1fs", what, grace + 5.0)
