"""HTTP server for health, metrics and debug views (`--http-address`).

Endpoints: /ready, /metrics, /debug/syncz, /debug/configz, /debug/config_dump?proxyID=,
/debug/connections, /debug/pushz (the most recent pushes). Everything is read-only; it binds
only where `--http-address` says. It decides how each view is laid out as JSON; what it shows
comes from the few read-only views it is handed (the Protocols below), never from the
control plane as a whole.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web
from aiohttp.typedefs import Middleware

# Imported for their side effect: the Any payloads in config_dump decode through the default
# descriptor pool, which must know every type we generate (including nested typed_config).
from envoy.config.cluster.v3 import cluster_pb2  # noqa: F401
from envoy.config.endpoint.v3 import endpoint_pb2  # noqa: F401
from envoy.config.listener.v3 import listener_pb2  # noqa: F401
from envoy.config.route.v3 import route_pb2  # noqa: F401
from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401
from envoy.extensions.filters.network.http_connection_manager.v3 import (  # noqa: F401
    http_connection_manager_pb2,
)
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2  # noqa: F401
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401
from google.protobuf import any_pb2, json_format

from control.config.errors import ConfigError
from control.gatewayapi import status as gateway_status
from control.httpserve import AppServer
from control.model.proxy import Proxy
from control.model.types import MeshConfig
from control.xds.cache import ResourceSet
from protos import typeurls

logger = logging.getLogger(__name__)

_DUMP_TYPES = (typeurls.CLUSTER, typeurls.ENDPOINT, typeurls.LISTENER, typeurls.ROUTE)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        text=json.dumps(data, indent=2, sort_keys=False) + "\n",
        status=status,
        content_type="application/json",
    )


class StreamsView(Protocol):
    """The open ADS streams (control/xds/views.py's StreamViews). Contract: read-only, cheap,
    answered on the event loop; rows are JSON-ready."""

    def syncz(self) -> list[dict[str, Any]]: ...

    def connections(self) -> list[dict[str, Any]]: ...

    def proxy(self, name: str) -> Proxy | None:
        """The connected proxy `name` means (node id or pod.namespace), or None."""
        ...


class ConfigView(Protocol):
    """The config in use (a ConfigSource). Contract: read-only; `errors` are the inputs that
    currently fail, `status()` the source's own JSON-ready summary."""

    @property
    def current(self) -> MeshConfig: ...

    @property
    def errors(self) -> Mapping[str, ConfigError]: ...

    def status(self) -> Mapping[str, object]: ...


class PushRecordView(Protocol):
    """One push as JSON (control/pipeline.py's PushRecord); pure, read-only."""

    def as_json(self) -> dict[str, object]: ...


class PushesView(Protocol):
    """The push history (control/pipeline.py's PushPipeline). Contract: read-only; `pushes`
    counts every push since start, `push_log` holds the most recent ones, oldest first."""

    @property
    def pushes(self) -> int: ...

    @property
    def push_log(self) -> Iterable[PushRecordView]: ...


# The resources generated for one proxy, by type (the current push's ResourceSource);
# read-only and without I/O.
ResourcesFor = Callable[[Proxy, Iterable[str]], Mapping[str, ResourceSet]]


@dataclass(eq=False, kw_only=True)
class DebugServer:
    """The views it serves, each handed in read-only; `start(address)` binds and answers the
    port, `close()` stops serving."""

    ready: Callable[[], bool]
    metrics: Callable[[], bytes]
    streams: StreamsView
    config: ConfigView
    pushes: PushesView
    resources: ResourcesFor
    # The workloads auto-registered through WorkloadGroups, as JSON-ready WorkloadEntry
    # objects (WorkloadRegistry.workload_entries); read-only, cheap.
    registered: Callable[[], list[dict[str, Any]]] = list
    # Who may read /debug/* (control/debugaccess.py); None: everyone.
    access: Middleware | None = None
    # The mesh config in effect and where it came from (MeshConfigSource.status).
    mesh: Callable[[], Mapping[str, object]] = dict
    # More views on the same server and access rule (the dashboard's `/ui/`).
    routes: Iterable[Callable[[web.UrlDispatcher], None]] = ()
    _server: AppServer = field(default_factory=AppServer, init=False)

    async def start(self, address: str) -> int:
        app = web.Application(middlewares=[self.access] if self.access else [])
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/debug/syncz", self._syncz)
        app.router.add_get("/debug/configz", self._configz)
        app.router.add_get("/debug/config_dump", self._config_dump)
        app.router.add_get("/debug/connections", self._connections)
        app.router.add_get("/debug/pushz", self._pushz)
        for add in self.routes:
            add(app.router)
        return await self._server.start(app, address)

    async def close(self) -> None:
        await self._server.close()

    async def _ready(self, request: web.Request) -> web.Response:
        if self.ready():
            return web.Response(text="ready\n")
        return web.Response(text="not ready\n", status=503)

    async def _metrics(self, request: web.Request) -> web.Response:
        body = self.metrics()
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    async def _syncz(self, request: web.Request) -> web.Response:
        return _json(self.streams.syncz())

    async def _connections(self, request: web.Request) -> web.Response:
        return _json(self.streams.connections())

    async def _pushz(self, request: web.Request) -> web.Response:
        """The last pushes, oldest first (at most control.pipeline.PUSH_LOG_SIZE)."""
        return _json(
            {
                "pushes": self.pushes.pushes,
                "recent": [r.as_json() for r in self.pushes.push_log],
            }
        )

    async def _configz(self, request: web.Request) -> web.Response:
        config = self.config.current
        objects = [
            {"source": {"file": ref.file, "line": ref.line}, **dict(obj)} for ref, obj in config.raw
        ]
        errors = {path: str(err) for path, err in self.config.errors.items()}
        warnings = [str(w) for w in config.warnings]
        return _json(
            {
                "objects": objects,
                "errors": errors,
                "warnings": warnings,
                # Workloads auto-registered through WorkloadGroups, as WorkloadEntries.
                "registered": self.registered(),
                # Gateway API status as computed (and, in Kubernetes mode, written back).
                "gatewayStatus": [gateway_status.as_json(s) for s in config.gateway_api_status],
                # The source's own summary: files in use, reload and failure counts (file
                # mode), or the state of each Kubernetes watch.
                "source": self.config.status(),
                "mesh_config": self.mesh(),
            }
        )

    async def _config_dump(self, request: web.Request) -> web.Response:
        proxy_id = request.query.get("proxyID", "")
        if not proxy_id:
            return _json({"error": "proxyID query parameter is required"}, status=400)
        proxy = self.streams.proxy(proxy_id)
        if proxy is None:
            return _json({"error": f"no connected proxy {proxy_id!r}"}, status=404)
        sets = self.resources(proxy, _DUMP_TYPES)
        out: dict[str, Any] = {"proxy": proxy.id, "resources": {}}
        for type_url, rs in sets.items():
            decoded = []
            for name in sorted(rs):
                any_msg = any_pb2.Any.FromString(rs[name].any_bytes)
                decoded.append(
                    {
                        "name": name,
                        "version": rs[name].version,
                        "resource": json_format.MessageToDict(any_msg),
                    }
                )
            out["resources"][typeurls.SHORT_NAMES.get(type_url, type_url)] = decoded
        return _json(out)
