"""Listening hosts handed to the event loop as bytes (agent/bindaddr.py): the servers still
listen where they were asked to, IPv4 and IPv6, and a name that is not an IP literal is left
to the loop."""

from __future__ import annotations

import asyncio
import shutil
import socket
from pathlib import Path

import pytest

from agent.bindaddr import server_hosts, udp_socket
from agent.envoy.process import executable


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
async def test_tcp_server_listens_on_the_host_given_as_bytes(host: str) -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), server_hosts(host), 0)
    try:
        addr = server.sockets[0].getsockname()
        assert addr[0] == host
        _, writer = await asyncio.open_connection(host, addr[1])
        writer.close()
    finally:
        server.close()


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_udp_socket_is_bound_to_the_ip_literal(host: str) -> None:
    sock = udp_socket(host, 0)
    assert sock is not None
    with sock:
        assert sock.getsockname()[0] == host
        assert sock.type == socket.SOCK_DGRAM
        assert not sock.getblocking()


def test_a_name_or_non_ascii_host_is_left_to_the_loop() -> None:
    assert udp_socket("localhost", 0) is None
    assert udp_socket("bücher.example", 0) is None
    assert server_hosts("bücher.example") == ["bücher.example"]


def test_executable_answers_as_shutil_which(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exe, plain = tmp_path / "exe", tmp_path / "plain"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    plain.write_text("")
    monkeypatch.setenv("PATH", str(tmp_path))
    for cmd in (str(exe), str(plain), "exe", "plain", "missing", str(tmp_path)):
        assert executable(cmd) == (shutil.which(cmd) is not None), cmd
