"""The agent's first moments (agent/launch.py): what it imports before Envoy is started, and a
socket bound before its server starts holds a client's connection until it is served."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from agent.unixsocket import UnixGrpcServer
from protos.ads import raw_ads_handler
from tests.support.fresh import ROOT, fresh_lines


def test_launch_imports_no_heavy_library() -> None:
    """Envoy is started before the heavy imports; agent/launch.py pulls in none of them
    (a count of modules in a fresh interpreter, not a timing)."""
    code = (
        "import sys\n"
        "import agent.__main__, agent.launch\n"
        "heavy = ('cryptography', 'google', 'envoy', 'prometheus_client', 'dnslib', 'yaml')\n"
        "print(','.join(sorted({n.split('.')[0] for n in sys.modules} & set(heavy))))\n"
        "print(sorted(n for n in sys.modules if n.startswith('agent.')))\n"
    )
    out = fresh_lines(code)
    assert out[0] == "", f"agent/launch.py imports {out[0]}"
    assert "'agent.app'" not in out[1] and "'agent.sds.secrets'" not in out[1], out[1]


# A client in its own process (as Envoy is): one RPC without wait_for_ready, so a refused
# connection fails it at once instead of being retried.
_CLIENT = """
import sys, grpc
from protos.ads import SOTW_METHOD, identity
channel = grpc.insecure_channel("unix:" + sys.argv[1])
method = channel.stream_stream(SOTW_METHOD, request_serializer=identity,
                               response_deserializer=identity)
print("connecting", flush=True)
print(next(method(iter([b"hello"]), timeout=20)).decode(), flush=True)
"""


async def test_bound_socket_queues_a_client_until_served(tmp_path: Path) -> None:
    """A client that connects between bind() and start() gets its answer once the server
    starts, on its first attempt."""
    server = UnixGrpcServer(tmp_path / "XDS", 0o600)
    server.bind()
    assert (tmp_path / "XDS").exists()

    async def echo(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        async for raw in requests:
            await context.write(raw)
            return

    client = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CLIENT,
        str(tmp_path / "XDS"),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    assert client.stdout is not None
    try:
        assert await asyncio.wait_for(client.stdout.readline(), 30) == b"connecting\n"
        await asyncio.sleep(0.5)  # its connection waits in the socket's queue meanwhile
        await server.start(raw_ads_handler(echo, echo))
        out, _ = await asyncio.wait_for(client.communicate(), 30)
    finally:
        if client.returncode is None:
            client.kill()
            await client.wait()
        await server.close(0)
    assert out == b"hello\n"
    assert client.returncode == 0
    assert not (tmp_path / "XDS").exists()


async def test_bound_but_never_started_socket_closes(tmp_path: Path) -> None:
    server = UnixGrpcServer(tmp_path / "SDS", 0o600)
    server.bind()
    await server.close(0.5)
    assert not (tmp_path / "SDS").exists()
