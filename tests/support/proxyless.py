"""Proxyless gRPC end to end: real grpcio xDS servers and clients in subprocesses, each
beside its own `pilotfish-agent --proxy-only`, configured only by the control plane and the
bootstrap and certificate files their agents write.

Client and server run in subprocesses: grpc reads GRPC_XDS_BOOTSTRAP once per process. The
server is grpcio's synchronous server because `grpc.aio.server` has no `xds` option (its
Cython core hard-codes xDS off).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tests.support.agentproc import AgentProcess
from tests.support.controlplane import eventually
from tests.support.mesh import mesh_agent, workload_group_yaml

PORT = 8080
METHOD = "/test.Echo/Who"
ECHO_HOST = "echo.default.svc.cluster.local"
TARGET = f"xds:///{ECHO_HOST}:7070"

MESH = textwrap.dedent(
    f"""
    apiVersion: v1
    kind: Service
    metadata: {{name: echo, namespace: default}}
    spec:
      selector: {{app: echo}}
      ports: [{{name: grpc, port: 7070, targetPort: {PORT}}}]
    ---
    """
) + workload_group_yaml("echo")  # the echo server's agent registers through it


def peer_authentication(mode: str) -> str:
    return textwrap.dedent(
        f"""
        apiVersion: security.istio.io/v1
        kind: PeerAuthentication
        metadata: {{name: default, namespace: default}}
        spec: {{mtls: {{mode: {mode}}}}}
        """
    )


# Answers METHOD with what it knows of the caller: the SANs and serial of the certificate
# the peer presented (empty over plaintext). Prints "serving" once the xDS listener arrived.
SERVER = textwrap.dedent(
    """
    import json, os, sys, threading
    from concurrent import futures
    import grpc
    from cryptography import x509

    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()

    def who(request, context):
        auth = context.auth_context()
        pem = b"".join(auth.get("x509_pem_cert", []))
        serial = format(x509.load_pem_x509_certificate(pem).serial_number, "x") if pem else ""
        return json.dumps({
            "sans": sorted(v.decode() for v in auth.get("x509_subject_alternative_name", [])),
            "security": [v.decode() for v in auth.get("transport_security_type", [])],
            "serial": serial,
        }).encode()

    def status(address, serving, error):
        print(json.dumps({"status": serving, "address": address}), flush=True)

    # Every method named on the command line (one service) answers the same.
    service = sys.argv[2][1:].partition("/")[0]
    handler = grpc.method_handlers_generic_handler(
        service,
        {m.rpartition("/")[2]: grpc.unary_unary_rpc_method_handler(who) for m in sys.argv[2:]},
    )
    server = grpc.server(futures.ThreadPoolExecutor(4), handlers=(handler,), xds=True)
    creds = grpc.xds_server_credentials(grpc.insecure_server_credentials())
    server.add_secure_port(sys.argv[1], creds)
    server.start()
    print(json.dumps({"started": sys.argv[1]}), flush=True)
    server.wait_for_termination()
    """
)

# Calls TARGET in a loop. With "fresh", every call goes over a new channel with its own
# subchannel (no sharing with earlier channels), so every call makes a new TLS handshake
# with the certificates of that moment. A "fresh" client also keeps one more connection open
# (`pinned`, answered once, never printed): gRPC 1.85's xDS server forgets its certificates
# when its last TLS connection closes, and a handshake that arrives during that moment finds
# none and is refused ("Failed to create security handshaker" on the server; a race between
# the distributor's watch and cancel callbacks in gRPC core). With a connection open
# throughout, each fresh handshake tests the rotated certificates and not that race.
CLIENT = textwrap.dedent(
    """
    import json, os, sys, threading, time
    import grpc
    import grpc.experimental

    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    target, method, fresh = sys.argv[1], sys.argv[2], sys.argv[3] == "fresh"
    creds = grpc.xds_channel_credentials(grpc.experimental.insecure_channel_credentials())
    options = [("grpc.use_local_subchannel_pool", 1)]
    channel = grpc.secure_channel(target, creds, options=options)
    pinned = grpc.secure_channel(target, creds, options=options) if fresh else None
    answered = not fresh  # pinned is kept open till exit
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if pinned is not None and not answered:
            try:
                pinned.unary_unary(method)(b"", timeout=3)
                answered = True
            except grpc.RpcError:
                pass
        if fresh:
            channel.close()
            channel = grpc.secure_channel(target, creds, options=options)
        try:
            line = json.loads(channel.unary_unary(method)(b"", timeout=3))
        except grpc.RpcError as e:
            line = {"error": e.code().name, "details": e.details()}
        line["t"] = time.time()
        print(json.dumps(line), flush=True)
        time.sleep(0.05)
    """
)


class Proc:
    """A Python subprocess printing JSON lines, and the lines so far."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[dict[str, object]] = []
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.lines.append(json.loads(raw))

    def calls(self) -> list[dict[str, object]]:
        return [line for line in self.lines if "t" in line]

    async def close(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
        await self.proc.wait()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


@contextlib.asynccontextmanager
async def python(script: str, boot: Path, *args: str) -> AsyncIterator[Proc]:
    env = {**os.environ, "GRPC_XDS_BOOTSTRAP": str(boot)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    p = Proc(proc)
    try:
        yield p
    finally:
        await p.close()


@contextlib.asynccontextmanager
async def agent(
    cp: Any,
    workdir: Path,
    ip: str,
    pod: str,
    labels: str,
    *extra: str,
    service_account: str,
    group: str = "",
) -> AsyncIterator[AgentProcess]:
    """A proxy-only agent on the TLS port with a token of `service_account`; `group`: the
    WorkloadGroup it registers in ("" = a client only)."""
    proc = mesh_agent(
        cp,
        workdir.parent,
        ip,
        pod,
        labels,
        "--proxy-only",
        "--dns-port",
        "0",
        *extra,
        group=group,
        service_account=service_account,
        workdir=workdir,
    )
    proc.start()
    try:
        boot = workdir / "grpc-bootstrap.json"
        await eventually(lambda: (workdir / "certs" / "key.pem").exists(), timeout=20)
        await eventually(boot.exists, timeout=5)
        yield proc
    finally:
        assert proc.terminate() == 0, proc.log()[-3000:]


async def settled(client: Proc, check: object, *, timeout: float, settle: int = 5) -> None:
    """Until the client's last `settle` calls all satisfy `check`."""
    assert callable(check)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        recent = client.calls()[-settle:]
        if len(recent) == settle and all(check(line) for line in recent):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"calls did not settle within {timeout}s: {client.calls()[-3:]}")


@contextlib.asynccontextmanager
async def echo_and_caller(
    cp: Any, tmp_path: Path, server_ip: str, client_ip: str, *extra: str
) -> AsyncIterator[None]:
    """The agents of the echo server (service account `echo`, workdir tmp_path/server) and of
    its caller (`caller`, tmp_path/client), both proxy-only, each with its own token."""
    async with (
        agent(
            cp,
            tmp_path / "server",
            server_ip,
            "echo-1",
            "app=echo",
            *extra,
            service_account="echo",
            group="echo",
        ),
        agent(
            cp,
            tmp_path / "client",
            client_ip,
            "caller-1",
            "app=caller",
            *extra,
            service_account="caller",
        ),
    ):
        yield
