"""The probe checks themselves (asyncio): each returns None on success or the reason of the
failure, and is bounded by the caller's timeout. HTTP GET succeeds on a status of 200 to 399
and TCP on an accepted connection (Kubernetes' rules); HTTPS is not verified (Kubernetes
does not verify probe certificates either). gRPC asks the standard health service
(`grpc.health.v1.Health/Check`, plaintext, as Kubernetes' gRPC probe) and succeeds on
SERVING. `exec` is not run (see checker.py)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl

import grpc
from google.protobuf import wrappers_pb2

_MAX_STATUS_LINE = 4096
_HEALTH_CHECK = "/grpc.health.v1.Health/Check"
# grpc.health.v1.HealthCheckResponse.ServingStatus
_SERVING_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


class CheckError(Exception):
    """The check could not get an answer (the reason is the message)."""


async def http_get(
    host: str,
    port: int,
    path: str = "/",
    *,
    https: bool = False,
    headers: tuple[tuple[str, str], ...] = (),
) -> str | None:
    try:
        status, _ = await http_status(host, port, path, https=https, headers=headers)
    except CheckError as e:
        return str(e)
    if 200 <= status < 400:
        return None
    return f"HTTP GET {host}:{port}{path}: status {status}"


async def http_status(
    host: str,
    port: int,
    path: str = "/",
    *,
    https: bool = False,
    headers: tuple[tuple[str, str], ...] = (),
    max_body: int = 0,
) -> tuple[int, bytes]:
    """(status, up to `max_body` bytes of the body as sent) of one GET; CheckError when there
    is no HTTP answer. `headers` may set Host and User-Agent (else ours)."""
    context: ssl.SSLContext | None = None
    if https:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        reader, writer = await asyncio.open_connection(host, port, ssl=context)
    except OSError as e:
        raise CheckError(f"HTTP GET {host}:{port}: {e.strerror or e}") from None
    try:
        names = {k.lower() for k, _ in headers}
        lines = [f"GET {path or '/'} HTTP/1.1"]
        if "host" not in names:
            lines.append(f"Host: {_authority(host, port)}")
        if "user-agent" not in names:
            lines.append("User-Agent: pilotfish-probe/1")
        lines += [f"{k}: {v}" for k, v in headers] + ["Connection: close", "", ""]
        writer.write("\r\n".join(lines).encode("latin-1"))
        await writer.drain()
        status_line = await reader.readuntil(b"\n")
        body = b""
        if max_body:
            await reader.readuntil(b"\r\n\r\n")
            body = await reader.read(max_body)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
        raise CheckError(f"HTTP GET {host}:{port}{path}: {e}") from None
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
    parts = status_line[:_MAX_STATUS_LINE].decode("latin-1").split()
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise CheckError(f"HTTP GET {host}:{port}{path}: not an HTTP response")
    return int(parts[1]), body


async def tcp_connect(host: str, port: int) -> str | None:
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError as e:
        return f"TCP connect {host}:{port}: {e.strerror or e}"
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return None


async def grpc_health(host: str, port: int, service: str = "") -> str | None:
    # The health messages have the wire shape of protobuf's wrappers (HealthCheckRequest is
    # `string service = 1`, HealthCheckResponse `ServingStatus status = 1`, a varint): using
    # those avoids a dependency on grpcio-health-checking, and a second registration of
    # grpc.health.v1 in the descriptor pool when an app in the same process has it.
    async with grpc.aio.insecure_channel(_authority(host, port)) as channel:
        check = channel.unary_unary(
            _HEALTH_CHECK,
            request_serializer=wrappers_pb2.StringValue.SerializeToString,
            response_deserializer=wrappers_pb2.Int32Value.FromString,
        )
        try:
            resp = await check(wrappers_pb2.StringValue(value=service))
        except grpc.aio.AioRpcError as e:
            return f"gRPC health {host}:{port}: {e.code().name}"
    status = int(resp.value)
    if status == 1:
        return None
    return f"gRPC health {host}:{port}: {_SERVING_STATUS.get(status, str(status))}"


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
