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


def test_relay_then_certificate_are_started_before_the_rest_is_imported() -> None:
    """agent/__main__.py serves xDS, then starts the first signing, then the certificate's
    parts, before it imports the rest of the agent: the relay needs neither cryptography nor
    the certificate's modules, the signing not the secret manager's or SDS's, and none needs
    agent.app, DNS or the status server (counted in modules)."""
    code = (
        "import asyncio, sys, tempfile\n"
        "from agent.config import build_parser, config_from_args\n"
        "from agent.launch import Launch\n"
        "def loaded(*names):\n"
        "    return ','.join(n for n in names if n in sys.modules)\n"
        "async def main():\n"
        "    args = ['--proxy-only', '--workdir', tempfile.mkdtemp(),\n"
        "            '--control-plane', '127.0.0.1:1', '--dns-port', '0']\n"
        "    launch = Launch(config_from_args(build_parser().parse_args(args)))\n"
        "    await launch.start()\n"
        "    await launch.start_relay()\n"
        "    print(launch.relay is not None and launch.relay.downstream is not None)\n"
        "    print(loaded('agent.app', 'agent.certstart', 'cryptography', 'dnslib',\n"
        "                 'agent.status'))\n"
        "    await launch.start_signing()\n"
        "    print(loaded('agent.app', 'agent.sds.secrets', 'agent.sds.server', 'dnslib'))\n"
        "    await launch.start_certs()\n"
        "    print(loaded('agent.app', 'dnslib', 'agent.status', 'agent.dns.server'))\n"
        "    await launch.close()\n"
        "asyncio.run(main())\n"
    )
    out = fresh_lines(code)
    assert out[:4] == ["True", "", "", ""], out


def test_envoy_launcher_is_spawned_before_grpc_and_execs_only_when_told(tmp_path: Path) -> None:
    """agent/__main__.py spawns Envoy's launcher before it imports gRPC; the launcher execs
    Envoy only on `start()`, and exits without it when the agent closes first."""
    binary = tmp_path / "envoy"
    binary.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/started-$PPID-$$"\n')
    binary.chmod(0o755)
    code = (
        "import asyncio, sys\n"
        "import agent.__main__\n"
        "from agent.config import build_parser, config_from_args\n"
        "from agent.envoystart import envoy_supervisor\n"
        "async def one(workdir, go):\n"
        f"    args = ['--workdir', workdir, '--envoy-binary', {str(binary)!r}]\n"
        "    envoy = envoy_supervisor(config_from_args(build_parser().parse_args(args)))\n"
        "    await envoy.spawn()\n"
        "    print('grpc' in sys.modules, flush=True)\n"
        "    await asyncio.sleep(0.3)\n"
        "    if go:\n"
        "        await envoy.start()\n"
        "        await envoy.wait()\n"
        "    await envoy.close()\n"
        "async def main():\n"
        f"    await one({str(tmp_path / 'a')!r}, False)\n"
        f"    await one({str(tmp_path / 'b')!r}, True)\n"
        "asyncio.run(main())\n"
    )
    assert fresh_lines(code)[:2] == ["False", "False"]
    started = [p.read_text() for p in tmp_path.glob("started-*")]
    assert len(started) == 1, started
    assert started[0].startswith(f"-c {tmp_path / 'b' / 'envoy-rev.json'} "), started


def test_making_the_agent_imports_nothing_its_thread_did_not() -> None:
    """`Agent(cfg)` runs on the event loop: every module it needs for its mode (Envoy with
    the standard metrics, a WorkloadGroup member, a pod with app probes) was imported
    beforehand, in the thread that imports agent.app (agent/__main__.py)."""
    probers = '{"/app-health/app/readyz": {"tcpSocket": {"port": 8080}}}'
    code = (
        "import asyncio, os, sys, tempfile\n"
        "from agent.__main__ import _import_agent\n"
        "from agent.config import build_parser, config_from_args\n"
        "import agent.envoystart, agent.envoy.process  # first, for Envoy's launcher\n"
        "async def main():\n"
        "    args = ['--workdir', tempfile.mkdtemp(), '--control-plane', '127.0.0.1:1']\n"
        f"    env = {{**os.environ, 'ISTIO_KUBE_APP_PROBERS': {probers!r}}}\n"
        "    cfg = config_from_args(build_parser().parse_args(args), env)\n"
        "    assert cfg.app_probers\n"
        "    object.__setattr__(cfg, 'workload_group', 'group')\n"
        "    _import_agent(cfg)\n"
        "    before = set(sys.modules)\n"
        "    from agent.app import Agent\n"
        "    Agent(cfg)\n"
        "    print(sorted(set(sys.modules) - before), flush=True)\n"
        "    os._exit(0)\n"
        "asyncio.run(main())\n"
    )
    assert fresh_lines(code)[0] == "[]"
