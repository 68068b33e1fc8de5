"""Test-session plumbing shared by every test directory."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator

import pytest


@pytest.fixture(scope="session", autouse=True)
async def _collect_grpc_objects_while_the_loop_runs() -> AsyncIterator[None]:
    """grpc.aio servers and channels schedule their cleanup on the event loop when they are
    garbage-collected. Collect them at the end of the session while the (session-scoped)
    loop still runs; collected after it closed, their finalizers can block interpreter
    shutdown waiting for gRPC's poller thread."""
    yield
    for _ in range(3):
        gc.collect()
        await asyncio.sleep(0.05)
