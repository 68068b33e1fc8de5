"""gRPC access log providers end to end: two pods (agent + real Envoy + app), and receivers
written here that speak the real protocols over gRPC: Envoy's AccessLogService
(`envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs`, for `envoyHttpAls`) and
OTLP's LogsService (`opentelemetry.proto.collector.logs.v1.LogsService/Export`, for
`envoyOtelAls`).

- Selected by MeshConfig `defaultProviders.accessLogging`: each receiver gets one entry per
  request from each sidecar (client and server side), with the path and code, under the
  provider's `logName`; the HTTP service gets the additional request header asked for; the
  OTLP records carry the provider's `logFormat` (body text, attributes). A request the client
  sidecar answers itself (no route: 404) is logged once, by it.
- Selected by a Telemetry with `filter.expression: response.code >= 400`, live: the OTLP
  receiver then gets only errors, and the HTTP service nothing (not selected any more).
"""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from envoy.service.accesslog.v3.als_pb2 import StreamAccessLogsMessage, StreamAccessLogsResponse
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)

from tests.e2e.test_telemetry_access_logs import get, pods_dir, start_pods, write
from tests.support.apps import EchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.envoyadmin import draining, dynamic_listeners
from tests.support.grpcserver import start_generic_server
from tests.support.net import pod_ip

pytestmark = pytest.mark.envoy
__all__ = ["pods_dir"]  # the fixture, used by name

ALS_NAME, OTEL_NAME = "mesh-als", "mesh-otel"


@dataclass(frozen=True)
class Entry:
    """One access log entry as a receiver got it."""

    log_name: str
    path: str
    code: int
    headers: tuple[tuple[str, str], ...] = ()  # the additional request headers (ALS)
    attributes: tuple[tuple[str, str], ...] = ()  # OTLP record attributes
    body: str = ""


class GrpcReceiver:
    """A gRPC server on `host` with both services; what arrived is in `als` and `otel`."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.port = 0
        self.als: list[Entry] = []
        self.otel: list[Entry] = []
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        als = grpc.method_handlers_generic_handler(
            "envoy.service.accesslog.v3.AccessLogService",
            {
                "StreamAccessLogs": grpc.stream_unary_rpc_method_handler(
                    self._stream,
                    request_deserializer=StreamAccessLogsMessage.FromString,
                    response_serializer=StreamAccessLogsResponse.SerializeToString,
                )
            },
        )
        otel = grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.logs.v1.LogsService",
            {
                "Export": grpc.unary_unary_rpc_method_handler(
                    self._export,
                    request_deserializer=ExportLogsServiceRequest.FromString,
                    response_serializer=ExportLogsServiceResponse.SerializeToString,
                )
            },
        )
        self._server, self.port = await start_generic_server(self.host, als, otel)

    async def close(self) -> None:
        if self._server is not None:
            await self._server.stop(0)

    async def _stream(
        self, messages: AsyncIterator[StreamAccessLogsMessage], context: Any
    ) -> StreamAccessLogsResponse:
        log_name = ""
        async for m in messages:
            # The identifier comes with a stream's first message only.
            log_name = m.identifier.log_name or log_name
            for e in m.http_logs.log_entry:
                self.als.append(
                    Entry(
                        log_name,
                        e.request.path,
                        e.response.response_code.value,
                        tuple(sorted(e.request.request_headers.items())),
                    )
                )
        return StreamAccessLogsResponse()

    async def _export(
        self, request: ExportLogsServiceRequest, context: Any
    ) -> ExportLogsServiceResponse:
        for rl in request.resource_logs:
            resource = {a.key: a.value.string_value for a in rl.resource.attributes}
            # The bundled OTLP version names field 2 `instrumentation_library_logs`; it has
            # ScopeLogs' wire shape.
            for scope in rl.instrumentation_library_logs:
                for r in scope.logs:
                    attrs = {a.key: a.value.string_value for a in r.attributes}
                    self.otel.append(
                        Entry(
                            resource.get("log_name", ""),
                            attrs.get("path", ""),
                            int(attrs.get("code", "0") or 0),
                            attributes=tuple(sorted(attrs.items())),
                            body=r.body.string_value,
                        )
                    )
        return ExportLogsServiceResponse()


def mesh_config(receiver: GrpcReceiver) -> str:
    return textwrap.dedent(
        f"""\
        extensionProviders:
        - name: http-als
          envoyHttpAls:
            service: "{receiver.host}"
            port: {receiver.port}
            logName: {ALS_NAME}
            additionalRequestHeadersToLog: [x-user]
        - name: otel-als
          envoyOtelAls:
            service: "{receiver.host}"
            port: {receiver.port}
            logName: {OTEL_NAME}
            logFormat:
              text: "%REQ(:METHOD)% %REQ(:PATH)% %RESPONSE_CODE%"
              labels: {{path: "%REQ(:PATH)%", code: "%RESPONSE_CODE%"}}
        defaultProviders:
          accessLogging: [http-als, otel-als]
        """
    )


ERRORS_ONLY = """\
    apiVersion: telemetry.istio.io/v1
    kind: Telemetry
    metadata: {name: mesh-default, namespace: istio-system}
    spec:
      accessLogging:
      - providers: [{name: otel-als}]
        filter: {expression: "response.code >= 400"}
    """


async def loggers(ip: str, *names: str) -> bool:
    """The pod's Envoy runs exactly the loggers named `names` (by log name) of the two, and
    nothing from before is draining."""
    dump = await dynamic_listeners(ip)
    if dump is None or await draining(ip) != 0:
        return False
    return all((n in dump) == (n in names) for n in (ALS_NAME, OTEL_NAME))


def with_path(entries: list[Entry], prefix: str) -> list[Entry]:
    return [e for e in entries if e.path.startswith(prefix)]


async def test_http_and_otel_access_log_services(
    tmp_path: Path, pods_dir: tuple[Path, Path]
) -> None:
    cfg, mesh_file = pods_dir
    receiver = GrpcReceiver(pod_ip())
    await receiver.start()
    mesh_file.write_text(mesh_config(receiver))
    client_ip, backend_ip = pod_ip(), pod_ip()
    app = EchoApp("backend", backend_ip, 8080)
    await app.start()
    async with running_control_plane(cfg, mesh_config=mesh_file) as cp:
        pods = await start_pods(cp, tmp_path, client_ip, backend_ip)
        try:
            for ip in (client_ip, backend_ip):
                await eventually(
                    lambda ip=ip: loggers(ip, ALS_NAME, OTEL_NAME), timeout=30, what="loggers"
                )
            for i in range(3):
                status = await get_with(pods.url(f"/hello/{i}"), {"x-user": f"u{i}"})
                assert status == 200
            assert await get(pods.url("/nowhere"), host="unknown.example") == 404

            # Both sidecars log each request: two entries per path, one for the 404.
            def complete(entries: list[Entry]) -> list[Entry] | None:
                got = with_path(entries, "/hello/") + with_path(entries, "/nowhere")
                return got if len(got) == 7 else None

            als = await eventually(lambda: complete(receiver.als), timeout=30, what="ALS entries")
            otel = await eventually(
                lambda: complete(receiver.otel), timeout=30, what="OTLP records"
            )
            for entries in (als, otel):
                paths = sorted((e.path, e.code) for e in entries)
                assert paths == [
                    *[(f"/hello/{i}", 200) for i in range(3) for _ in range(2)],
                    ("/nowhere", 404),
                ], paths
            assert {e.log_name for e in als} == {ALS_NAME}
            assert {e.log_name for e in otel} == {OTEL_NAME}
            for e in with_path(als, "/hello/"):
                assert ("x-user", f"u{e.path[-1]}") in e.headers, e
            for e in otel:
                assert e.body == f"GET {e.path} {e.code}", e
                assert dict(e.attributes) == {"path": e.path, "code": str(e.code)}, e

            # A Telemetry picks the OTLP service only, for errors only; live.
            write(cfg / "telemetry.yaml", ERRORS_ONLY)
            for ip in (client_ip, backend_ip):
                await eventually(lambda ip=ip: loggers(ip, OTEL_NAME), timeout=30, what="filter")
            als_before = len(receiver.als)
            assert await get(pods.url("/filtered/ok")) == 200
            assert await get(pods.url("/filtered/missing"), host="unknown.example") == 404
            await eventually(
                lambda: with_path(receiver.otel, "/filtered/missing"),
                timeout=30,
                what="the error logged",
            )
            # Entries are flushed every second: two more and the 200 would be here too.
            await asyncio.sleep(2)
            assert [e.code for e in with_path(receiver.otel, "/filtered/")] == [404]
            assert len(receiver.als) == als_before
        finally:
            pods.client.kill()
            pods.backend.kill()
    await app.close()
    await receiver.close()


async def get_with(url: str, headers: dict[str, str]) -> int:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s,
            s.get(url, headers={"Host": "backend", **headers}) as r,
        ):
            await r.read()
            return r.status
    except (aiohttp.ClientError, TimeoutError):
        return 0
