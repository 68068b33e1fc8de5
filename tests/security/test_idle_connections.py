"""2,000 idle TCP connections from one peer to the control plane's plaintext xDS port (a real
`pilotfish-control` process): the process's resident memory grows by a bounded amount, and
another proxy is still served while they are open.

The bound is a safety bound, not a measurement: about 11 KB per connection was measured
(gRPC core's endpoint and its first read buffer, clamped by the server's read-buffer option),
and the test allows 50 KB. What keeps the hold short is the second test's guard: a connection
that has not completed its handshake (TLS, the HTTP/2 preface and SETTINGS) is closed after
`XdsOptions.handshake_timeout` (20 s) instead of gRPC core's 120 s."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from tests.security.common import MESH, ads_status, cds_request
from tests.support.controlplane import eventually
from tests.support.cpproc import ControlPlaneProcess

CONNECTIONS = 2_000
RSS_BOUND_PER_CONNECTION = 50 << 10
RSS_BOUND = CONNECTIONS * RSS_BOUND_PER_CONNECTION  # 100 MB


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture
async def control_plane(tmp_path: Path) -> AsyncIterator[ControlPlaneProcess]:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    cp = ControlPlaneProcess(
        "idle-target", tmp_path, "--config", str(cfg), "--state-dir", str(tmp_path / "state")
    )
    cp.start()
    try:
        await eventually(lambda: asyncio.to_thread(cp.is_ready), timeout=20, what="ready")
        yield cp
    finally:
        cp.kill()


def _connect_idle(port: int, n: int) -> list[socket.socket]:
    """Blocking (run in a thread): n connections that never send a byte."""
    out: list[socket.socket] = []
    try:
        for _ in range(n):
            out.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    except BaseException:
        for s in out:
            s.close()
        raise
    return out


async def _served(cp: ControlPlaneProcess) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(cp.xds) as ch:
        return await ads_status(ch, cds_request().SerializeToString(), timeout=15)


async def test_idle_connections_cost_bounded_memory_and_others_are_served(
    control_plane: ControlPlaneProcess,
) -> None:
    cp = control_plane
    assert cp.proc is not None
    pid = cp.proc.pid
    # Warm up: one proxy served, so the baseline includes what the first stream allocates.
    assert await _served(cp) is grpc.StatusCode.OK
    await asyncio.sleep(0.3)
    before_rss, before_fds = rss(pid), open_fds(pid)
    socks = await asyncio.to_thread(_connect_idle, cp.xds_port, CONNECTIONS)
    try:
        # The server really holds them all (accepted, one descriptor each).
        await eventually(
            lambda: open_fds(pid) >= before_fds + CONNECTIONS,
            timeout=15,
            what="the control plane to accept every connection",
        )
        # Another proxy, while they are open.
        assert await _served(cp) is grpc.StatusCode.OK
        await asyncio.sleep(0.5)
        grown = rss(pid) - before_rss
        assert grown < RSS_BOUND, f"RSS grew {grown >> 10} KB for {CONNECTIONS} connections"
        assert cp.proc.poll() is None, cp.log()[-2000:]
    finally:
        for s in socks:
            s.close()
    # And after they are gone.
    assert await _served(cp) is grpc.StatusCode.OK


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed this silent connection (never blocks)."""
    try:
        return sock.recv(1, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


async def test_connections_that_never_handshake_are_closed(tmp_path: Path) -> None:
    """The guard behind the bound above: a connection that never completes its handshake is
    closed after `XdsOptions.handshake_timeout` (20 s by default; 1 s here), on the plaintext
    and the TLS port, instead of gRPC core's own 120 s. A real client is unaffected."""
    from tests.support.controlplane import running_control_plane

    (tmp_path / "mesh.yaml").write_text(MESH)
    async with running_control_plane(tmp_path, handshake_timeout=1.0) as cp:
        socks = [
            *await asyncio.to_thread(_connect_idle, cp.xds_port, 100),
            *await asyncio.to_thread(_connect_idle, cp.secure_xds_port, 100),
        ]
        try:
            await eventually(
                lambda: all([_closed_by_server(s) for s in socks]),  # every one, each time
                timeout=15,
                what="the server to close every silent connection",
            )
            async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as ch:
                assert await ads_status(ch, cds_request().SerializeToString(), timeout=15) is (
                    grpc.StatusCode.OK
                )
        finally:
            for s in socks:
                s.close()
