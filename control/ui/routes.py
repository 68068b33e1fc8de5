"""`/ui/` over HTTP: the page and its assets (from the package, read once), and the JSON of
`/ui/api/*`. Thin: parameters are checked by params.py, answers come from the Dashboard.

Who may read any of it is decided before these handlers run, by the `--http-address`
server's access rule (control/debugaccess.py: the same as `/debug/*`). Every answer carries a
Content-Security-Policy that allows only the page's own script and style, so a string that
reached the DOM as markup by mistake still could not run.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from typing import Any

from aiohttp import web

from control.ui import params
from control.ui.dashboard import Dashboard, SourceError
from control.ui.details import DetailError
from control.ui.params import Param, ParamError
from pilotfish_common.lifecycle import Lifecycle

logger = logging.getLogger(__name__)

ASSETS = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "graph.js": "text/javascript",
    "style.css": "text/css",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def load_assets() -> dict[str, bytes]:
    """The page's files, shipped in the package (no build step, nothing fetched)."""
    folder = resources.files("control.ui") / "static"
    return {name: (folder / name).read_bytes() for name in ASSETS}


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(data, separators=(",", ":")).encode(),
        status=status,
        content_type="application/json",
        headers=SECURITY_HEADERS,
    )


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message, "status": status}, status)


class UiRoutes(Lifecycle):
    """The routes, and the Dashboard's start/close (its metrics source)."""

    def __init__(self, dashboard: Dashboard) -> None:
        self.dashboard = dashboard
        self._dashboard = dashboard
        self._assets: dict[str, bytes] = {}

    async def start(self) -> None:
        self._assets = await asyncio.to_thread(load_assets)
        await self._dashboard.start()

    async def close(self) -> None:
        await self._dashboard.close()

    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_get("/ui", self._redirect)
        router.add_get("/ui/", self._index)
        router.add_get("/ui/static/{name}", self._asset)
        router.add_get("/ui/api/graph", self._api(params.GRAPH, self._graph))
        router.add_get("/ui/api/proxies", self._api(params.PROXIES, self._proxies))
        router.add_get("/ui/api/config", self._api(params.CONFIG, self._config))
        router.add_get("/ui/api/node", self._api(params.DETAIL, self._node))
        router.add_get("/ui/api/edge", self._api(params.DETAIL, self._edge))
        router.add_get("/ui/api/{rest:.*}", self._unknown_api)

    async def _redirect(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPPermanentRedirect("/ui/")

    async def _index(self, request: web.Request) -> web.StreamResponse:
        return self._file("index.html")

    async def _asset(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in ASSETS or name == "index.html":
            return web.Response(status=404, text="not found\n", headers=SECURITY_HEADERS)
        return self._file(name)

    def _file(self, name: str) -> web.Response:
        return web.Response(
            body=self._assets[name],
            content_type=ASSETS[name],
            charset="utf-8",
            headers=SECURITY_HEADERS,
        )

    async def _unknown_api(self, request: web.Request) -> web.StreamResponse:
        return _error(
            404, f"no API {request.path!r} (see /ui/api/graph, proxies, config, node, edge)"
        )

    def _api(
        self,
        spec: Mapping[str, Param],
        answer: Callable[[dict[str, Any]], Awaitable[web.Response]],
    ) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                query = params.parse_query(request.query.items(), spec)
            except ParamError as e:
                return _error(400, str(e))
            try:
                return await answer(query)
            except DetailError as e:
                return _error(404, str(e))
            except SourceError as e:
                return _error(502, f"cannot read metrics: {e}")

        return handle

    async def _graph(self, q: dict[str, Any]) -> web.Response:
        body = await self._dashboard.graph_body(q["window"], q["namespace"])
        return web.Response(body=body, content_type="application/json", headers=SECURITY_HEADERS)

    async def _proxies(self, q: dict[str, Any]) -> web.Response:
        return _json(await self._dashboard.proxies(q["namespace"]))

    async def _config(self, q: dict[str, Any]) -> web.Response:
        return _json(self._dashboard.config(q["namespace"], q["kind"]))

    async def _node(self, q: dict[str, Any]) -> web.Response:
        return _json(await self._dashboard.node(q["id"], q["window"]))

    async def _edge(self, q: dict[str, Any]) -> web.Response:
        return _json(await self._dashboard.edge(q["id"], q["window"]))
