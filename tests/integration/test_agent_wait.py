"""`pilotfish-agent wait` as kubelet runs it (a process of its own) against a real agent
status server on 127.0.0.0/8: it returns once the server turns ready, and fails with the
reason when it never does or when nothing listens."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from agent.metrics import AgentMetrics
from agent.status import StatusServer
from tests.support.net import free_port


class Readiness:
    def __init__(self) -> None:
        self.reason: str | None = "no LDS yet"
        self.ready_at: float | None = None

    async def __call__(self) -> str | None:
        return self.reason

    def turn_ready(self) -> None:
        self.reason = None
        self.ready_at = time.monotonic()


async def _noop() -> None:
    return None


@asynccontextmanager
async def status_server(readiness: Readiness) -> AsyncIterator[StatusServer]:
    server = StatusServer(
        "127.0.0.1",
        0,
        readiness=readiness,
        metrics=AgentMetrics(),
        envoy_stats_url=None,
        on_quit=lambda: None,
        on_drain=_noop,
        ndsz=dict,
    )
    async with server:
        yield server


async def run_wait(*args: str) -> tuple[int, str, str, float]:
    """(exit code, stdout, stderr, monotonic time it exited)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent",
        "wait",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode(), time.monotonic()


async def test_returns_0_once_ready() -> None:
    readiness = Readiness()
    async with status_server(readiness) as server:
        waiter = asyncio.create_task(
            run_wait("--ip", "127.0.0.1", "--status-port", str(server.port), "--timeout", "30")
        )
        await asyncio.sleep(1.5)  # well past its start-up: it is polling a 503 by now
        assert not waiter.done()
        readiness.turn_ready()
        code, out, err, exited = await waiter
    assert code == 0, err
    assert readiness.ready_at is not None and exited > readiness.ready_at
    # The figure the README quotes; not asserted tightly on a shared 2-core machine.
    print(f"wait returned {exited - readiness.ready_at:.3f}s after readiness")
    assert exited - readiness.ready_at < 10
    assert out.startswith("pilotfish-agent wait: ready: http://127.0.0.1:")


async def test_istio_flags_and_url() -> None:
    readiness = Readiness()
    readiness.turn_ready()
    async with status_server(readiness) as server:
        code, out, err, _ = await run_wait(
            "--url",
            f"http://127.0.0.1:{server.port}/healthz/ready",
            "--timeoutSeconds",
            "10",
            "--periodMillis",
            "500",
            "--requestTimeoutMillis",
            "500",
        )
    assert code == 0, err


async def test_exits_1_with_the_reason_when_never_ready() -> None:
    async with status_server(Readiness()) as server:
        started = time.monotonic()
        code, out, err, exited = await run_wait("--status-port", str(server.port), "--timeout", "1")
    assert code == 1
    assert exited - started >= 1.0
    assert err.strip() == (
        f"pilotfish-agent wait: not ready after 1s: "
        f"http://127.0.0.1:{server.port}/healthz/ready: 503 no LDS yet"
    )
    assert "Traceback" not in err


async def test_exits_1_when_nothing_listens() -> None:
    port = free_port()
    code, out, err, _ = await run_wait("--status-port", str(port), "--timeout", "0.5")
    assert code == 1
    assert err.strip() == (
        f"pilotfish-agent wait: not ready after 0.5s: "
        f"http://127.0.0.1:{port}/healthz/ready: Connection refused"
    )
