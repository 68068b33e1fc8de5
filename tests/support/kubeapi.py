"""An in-test Kubernetes API server (aiohttp) speaking the real list/watch HTTP protocol.

No real API server can run here, so this fake is kept small and faithful to the parts the
control plane uses, as the API server behaves on the wire:

- `GET /api/v1/<plural>` and `/apis/<group>/<version>/<plural>`: a `<Kind>List` with
  `metadata.resourceVersion`, paged with `limit` / `continue`;
- `...?watch=1&resourceVersion=RV`: newline-delimited JSON events (`ADDED`, `MODIFIED`,
  `DELETED` with the object; `BOOKMARK` with only metadata.resourceVersion when
  `allowWatchBookmarks=true`), every event after RV first, then live ones; the stream ends
  after `timeoutSeconds`; a RV older than the compaction point gets an `ERROR` event holding
  a `Status` with code 410 (Gone, reason Expired) and the stream ends — exactly what etcd
  compaction produces;
- namespaced lists (`/api/v1/namespaces/<ns>/<plural>`), equality-based `labelSelector`
  (`k=v`, `k==v`, `k!=v`, comma-separated) and `fieldSelector` on `metadata.name` /
  `metadata.namespace` on every list and watch;
- `GET` of one object (`.../<plural>/<name>`, namespaced or cluster-scoped) and `PUT` to
  replace it: when the body carries `metadata.resourceVersion` it must equal the stored one,
  else 409 Conflict (optimistic concurrency, as the API server does; without one the update
  is unconditional); 404 NotFound for an object that does not exist;
- `POST` to a collection to create (409 AlreadyExists when the name is taken, 404 when the
  namespace does not exist) and `DELETE` of one object;
- `PATCH .../<name>/status` with a JSON merge patch: the status subresource (only `status`
  changes, a new resourceVersion, a MODIFIED event);
- the Gateway API kinds (`gateway.networking.k8s.io`, stored apart from Istio's `gateways`);
- `POST /apis/authentication.k8s.io/v1/tokenreviews`: a TokenReview answered from the
  tokens the test registered (audiences checked as the API server does);
- bearer-token auth on every request (401 otherwise), 404 for resources not served (a CRD that
  is not installed).

One global resourceVersion counter, as with etcd. Tests change state with `put`, `delete`,
`compact` (forget history) and `expire_watches` (end every open watch with a 410). To make a
race between clients happen every time rather than by luck, `hold_gets = N` holds answers to
the next single-object GETs until N of them are waiting, then answers them all with the same
state (once; later GETs are answered at once).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from pilotfish_common.lifecycle import Lifecycle

# plural -> (Kind, apiVersion) for the resources this fake serves.
RESOURCES: dict[str, tuple[str, str]] = {
    "services": ("Service", "v1"),
    "pods": ("Pod", "v1"),
    "namespaces": ("Namespace", "v1"),
    "nodes": ("Node", "v1"),
    "configmaps": ("ConfigMap", "v1"),
    "secrets": ("Secret", "v1"),
    "endpointslices": ("EndpointSlice", "discovery.k8s.io/v1"),
    "serviceentries": ("ServiceEntry", "networking.istio.io/v1"),
    "workloadentries": ("WorkloadEntry", "networking.istio.io/v1"),
    "sidecars": ("Sidecar", "networking.istio.io/v1"),
    "virtualservices": ("VirtualService", "networking.istio.io/v1"),
    "destinationrules": ("DestinationRule", "networking.istio.io/v1"),
    "peerauthentications": ("PeerAuthentication", "security.istio.io/v1"),
    "authorizationpolicies": ("AuthorizationPolicy", "security.istio.io/v1"),
    "telemetries": ("Telemetry", "telemetry.istio.io/v1"),
    "mutatingwebhookconfigurations": (
        "MutatingWebhookConfiguration",
        "admissionregistration.k8s.io/v1",
    ),
}
# The Gateway API: keyed `<plural>.<group>`, since its `gateways` are not Istio's.
GATEWAY_API = "gateway.networking.k8s.io"
for _plural, _kind, _version in (
    ("gatewayclasses", "GatewayClass", "v1"),
    ("gateways", "Gateway", "v1"),
    ("httproutes", "HTTPRoute", "v1"),
    ("grpcroutes", "GRPCRoute", "v1"),
    ("referencegrants", "ReferenceGrant", "v1beta1"),
    ("tlsroutes", "TLSRoute", "v1alpha2"),
    ("tcproutes", "TCPRoute", "v1alpha2"),
):
    RESOURCES[f"{_plural}.{GATEWAY_API}"] = (_kind, f"{GATEWAY_API}/{_version}")
CLUSTER_SCOPED = frozenset(
    ("namespaces", "nodes", "mutatingwebhookconfigurations", f"gatewayclasses.{GATEWAY_API}")
)
_BY_KIND = {
    (api_version.rpartition("/")[0], kind): plural
    for plural, (kind, api_version) in RESOURCES.items()
}


def _plural_of(kind: str, api_version: str = "") -> str:
    """The resource of a kind; `api_version` tells the Gateway API's Gateway from Istio's."""
    group = api_version.rpartition("/")[0]
    found = _BY_KIND.get((group, kind))
    if found is not None:
        return found
    (plural,) = [p for (g, k), p in _BY_KIND.items() if k == kind and g != GATEWAY_API] or [
        p for (_, k), p in _BY_KIND.items() if k == kind
    ]
    return plural


def _display(plural: str) -> str:
    """`services`, `virtualservices.networking.istio.io`: how API errors name a resource."""
    if "." in plural:
        return plural
    group = RESOURCES[plural][1].rpartition("/")[0]
    return f"{plural}.{group}" if group else plural


@dataclass
class _Watch:
    plural: str
    selects: Callable[[dict[str, Any]], bool] = lambda _obj: True
    queue: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)


@dataclass
class TokenInfo:
    namespace: str
    service_account: str
    audiences: tuple[str, ...] = ("istio-ca",)


class FakeKubeApi(Lifecycle):
    def __init__(self, token: str = "admin-token", *, bookmark_interval: float = 0.5) -> None:
        self.token = token
        self.bookmark_interval = bookmark_interval
        self.rv = 1
        self.compacted = 0  # watches from a RV below this get 410 Gone
        self.objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {p: {} for p in RESOURCES}
        self.history: list[tuple[int, str, str, dict[str, Any]]] = []  # rv, plural, type, obj
        self.watches: list[_Watch] = []
        self.requests: list[str] = []  # "LIST pods", "WATCH pods rv=12", ...
        self.tokens: dict[str, TokenInfo] = {}
        self.unserved: set[str] = set()  # plurals answering 404 (CRD not installed)
        self.hold_gets = 0
        self._held: list[asyncio.Future[None]] = []
        self.conflicts = 0  # PUTs answered 409
        self.updates = 0  # PUTs accepted
        self.creates = 0  # POSTs accepted
        self.already_exists = 0  # POSTs answered 409
        self.status_patches = 0  # PATCHes of .../status accepted
        self._runner: web.AppRunner | None = None
        self.port = 0

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1") -> None:
        app = web.Application()
        for prefix in ("/api/{version}", "/apis/{group}/{version}"):
            app.router.add_get(prefix + "/{plural}", self._collection)
            app.router.add_get(prefix + "/namespaces/{namespace}/{plural}", self._collection)
            app.router.add_post(prefix + "/namespaces/{namespace}/{plural}", self._create)
            for item in (
                prefix + "/{plural}/{name}",
                prefix + "/namespaces/{namespace}/{plural}/{name}",
            ):
                app.router.add_get(item, self._get_one)
                app.router.add_put(item, self._replace)
                app.router.add_delete(item, self._delete)
                app.router.add_patch(item + "/status", self._patch_status)
        app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", self._token_review)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, 0)
        await site.start()
        self.port = int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        self.url = f"http://{host}:{self.port}"

    async def close(self) -> None:
        for w in self.watches:
            w.queue.put_nowait(None)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def kubeconfig(self) -> str:
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "test",
                "contexts": [{"name": "test", "context": {"cluster": "fake", "user": "admin"}}],
                "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                "users": [{"name": "admin", "user": {"token": self.token}}],
            }
        )

    # --- state changes (the test's side) ---------------------------------------------------

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object (ADDED or MODIFIED); returns it with its new RV."""
        plural = _plural_of(obj["kind"], obj.get("apiVersion", ""))
        meta = obj.setdefault("metadata", {})
        if plural not in CLUSTER_SCOPED:
            meta.setdefault("namespace", "default")
        key = (meta.get("namespace", ""), meta["name"])
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        existed = key in self.objects[plural]
        stored: dict[str, Any] = json.loads(json.dumps(obj))
        self.objects[plural][key] = stored
        self._emit(plural, "MODIFIED" if existed else "ADDED", stored)
        return stored

    def delete(self, kind: str, namespace: str, name: str, api_version: str = "") -> None:
        plural = _plural_of(kind, api_version)
        obj = self.objects[plural].pop((namespace, name))
        self.rv += 1
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self._emit(plural, "DELETED", obj)

    def compact(self) -> None:
        """Forget the history up to now (etcd compaction)."""
        self.compacted = self.rv
        self.history.clear()

    def expire_watches(self) -> None:
        """Compact, then end every open watch with 410 Gone."""
        self.compact()
        for w in self.watches:
            w.queue.put_nowait(_gone())

    def _emit(self, plural: str, etype: str, obj: dict[str, Any]) -> None:
        self.history.append((self.rv, plural, etype, obj))
        for w in self.watches:
            if w.plural == plural and w.selects(obj):
                w.queue.put_nowait({"type": etype, "object": obj})

    # --- HTTP ------------------------------------------------------------------------------

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.token}"

    def _resource(self, request: web.Request) -> str | web.Response:
        """The plural a request is for, or the error answer (401, 404)."""
        if not self._authorized(request):
            return _status(401, "Unauthorized", "Unauthorized")
        plural = request.match_info["plural"]
        group = request.match_info.get("group")
        if f"{plural}.{group}" in RESOURCES:
            plural = f"{plural}.{group}"
        if plural not in RESOURCES or plural in self.unserved:
            return _status(404, "NotFound", "the server could not find the requested resource")
        version = request.match_info["version"]
        _, api_version = RESOURCES[plural]
        if (f"{group}/{version}" if group else version) != api_version:
            return _status(404, "NotFound", "the server could not find the requested resource")
        scoped = "namespace" in request.match_info
        item = "name" in request.match_info
        if (plural in CLUSTER_SCOPED and scoped) or (
            item and plural not in CLUSTER_SCOPED and not scoped
        ):
            return _status(404, "NotFound", "the server could not find the requested resource")
        return plural

    def _key(self, request: web.Request) -> tuple[str, str]:
        return (request.match_info.get("namespace", ""), request.match_info["name"])

    async def _get_one(self, request: web.Request) -> web.Response:
        plural = self._resource(request)
        if isinstance(plural, web.Response):
            return plural
        key = self._key(request)
        self.requests.append(f"GET {plural} {key[1]}")
        if self.hold_gets > 1:
            waiter = asyncio.get_running_loop().create_future()
            self._held.append(waiter)
            if len(self._held) >= self.hold_gets:
                self.hold_gets = 0
                for w in self._held:
                    if not w.done():
                        w.set_result(None)
                self._held = []
            await waiter
        obj = self.objects[plural].get(key)
        if obj is None:
            return _not_found(plural, key[1])
        kind, api_version = RESOURCES[plural]
        return web.json_response({**obj, "kind": kind, "apiVersion": api_version})

    async def _replace(self, request: web.Request) -> web.Response:
        plural = self._resource(request)
        if isinstance(plural, web.Response):
            return plural
        key = self._key(request)
        self.requests.append(f"PUT {plural} {key[1]}")
        try:
            body = await request.json()
        except ValueError:
            return _status(400, "BadRequest", "the body is not JSON")
        stored = self.objects[plural].get(key)
        if stored is None:
            return _not_found(plural, key[1])
        meta = body.get("metadata") or {}
        if meta.get("name") != key[1]:
            return _status(400, "BadRequest", "the name of the object does not match the URL")
        wanted = meta.get("resourceVersion")
        if wanted and wanted != stored["metadata"]["resourceVersion"]:
            self.conflicts += 1
            return _status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {_display(plural)} "{key[1]}": the object '
                "has been modified; please apply your changes to the latest version and try "
                "again",
            )
        self.updates += 1
        body["kind"], body["apiVersion"] = RESOURCES[plural]
        if key[0]:
            meta["namespace"] = key[0]
        return web.json_response(self.put(body))

    async def _create(self, request: web.Request) -> web.Response:
        plural = self._resource(request)
        if isinstance(plural, web.Response):
            return plural
        namespace = request.match_info["namespace"]
        try:
            body = await request.json()
        except ValueError:
            return _status(400, "BadRequest", "the body is not JSON")
        meta = body.setdefault("metadata", {})
        name = meta.get("name")
        self.requests.append(f"POST {plural} {name}")
        if not name:
            return _status(422, "Invalid", "metadata.name: Required value")
        if meta.get("namespace", namespace) != namespace:
            return _status(400, "BadRequest", "the namespace of the object does not match")
        if ("", namespace) not in self.objects["namespaces"]:
            return _status(404, "NotFound", f'namespaces "{namespace}" not found')
        if (namespace, name) in self.objects[plural]:
            self.already_exists += 1
            return _status(409, "AlreadyExists", f'{plural} "{name}" already exists')
        meta.pop("resourceVersion", None)
        meta["namespace"] = namespace
        body["kind"], body["apiVersion"] = RESOURCES[plural]
        self.creates += 1
        return web.json_response(self.put(body), status=201)

    async def _patch_status(self, request: web.Request) -> web.Response:
        """`PATCH .../<name>/status` with a JSON merge patch (RFC 7386): only `status`
        changes, as the status subresource allows; metadata.generation stays."""
        plural = self._resource(request)
        if isinstance(plural, web.Response):
            return plural
        key = self._key(request)
        self.requests.append(f"PATCH-STATUS {plural} {key[1]}")
        if request.content_type != "application/merge-patch+json":
            return _status(415, "UnsupportedMediaType", f"{request.content_type} not supported")
        try:
            body = await request.json()
        except ValueError:
            return _status(400, "BadRequest", "the body is not JSON")
        stored = self.objects[plural].get(key)
        if stored is None:
            return _not_found(plural, key[1])
        if not isinstance(body, dict):
            return _status(400, "BadRequest", "a merge patch must be an object")
        updated = json.loads(json.dumps(stored))
        status = _merge_patch(updated.get("status") or {}, body.get("status") or {})
        updated["status"] = status
        self.status_patches += 1
        updated["kind"], updated["apiVersion"] = RESOURCES[plural]
        return web.json_response(self.put(updated))

    async def _delete(self, request: web.Request) -> web.Response:
        plural = self._resource(request)
        if isinstance(plural, web.Response):
            return plural
        key = self._key(request)
        self.requests.append(f"DELETE {plural} {key[1]}")
        if key not in self.objects[plural]:
            return _not_found(plural, key[1])
        self.delete(RESOURCES[plural][0], *key, api_version=RESOURCES[plural][1])
        return _status(200, "Success", "deleted")

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        plural = self._resource(request)
        if isinstance(plural, web.Response):
            return plural
        kind, api_version = RESOURCES[plural]
        if request.query.get("watch") in ("1", "true"):
            return await self._watch(request, plural)
        self.requests.append(f"LIST {plural}")
        namespace = request.match_info.get("namespace")
        selects = _selector(request)
        items = [
            self.objects[plural][k]
            for k in sorted(self.objects[plural])
            if (namespace is None or k[0] == namespace) and selects(self.objects[plural][k])
        ]
        limit = int(request.query.get("limit", "0") or 0)
        start = int(request.query.get("continue", "0") or 0)
        end = start + limit if limit else len(items)
        meta: dict[str, Any] = {"resourceVersion": str(self.rv)}
        if end < len(items):
            meta["continue"] = str(end)
        body = {
            "kind": f"{kind}List",
            "apiVersion": api_version,
            "metadata": meta,
            "items": items[start:end],
        }
        return web.json_response(body)

    async def _watch(self, request: web.Request, plural: str) -> web.StreamResponse:
        rv = int(request.query.get("resourceVersion", "0") or 0)
        self.requests.append(f"WATCH {plural} rv={rv}")
        bookmarks = request.query.get("allowWatchBookmarks") == "true"
        timeout = float(request.query.get("timeoutSeconds", "1800"))
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        selects = _selector(request)
        watch = _Watch(plural, selects)
        if rv and rv < self.compacted:
            await _send(resp, _gone())
            return resp
        for ev_rv, ev_plural, etype, obj in self.history:
            if ev_plural == plural and ev_rv > rv and selects(obj):
                watch.queue.put_nowait({"type": etype, "object": obj})
        self.watches.append(watch)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while (left := deadline - loop.time()) > 0:
                try:
                    event = await asyncio.wait_for(
                        watch.queue.get(), min(left, self.bookmark_interval)
                    )
                except TimeoutError:
                    if bookmarks:
                        kind, api_version = RESOURCES[plural]
                        await _send(
                            resp,
                            {
                                "type": "BOOKMARK",
                                "object": {
                                    "kind": kind,
                                    "apiVersion": api_version,
                                    "metadata": {"resourceVersion": str(self.rv)},
                                },
                            },
                        )
                    continue
                if event is None:
                    break
                await _send(resp, event)
                if event["type"] == "ERROR":
                    break
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.watches.remove(watch)
        return resp

    async def _token_review(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _status(401, "Unauthorized", "Unauthorized")
        review = await request.json()
        spec = review.get("spec") or {}
        info = self.tokens.get(spec.get("token", ""))
        wanted: Iterable[str] = spec.get("audiences") or ()
        status: dict[str, Any] = {"authenticated": False}
        if info is None:
            status["error"] = "invalid bearer token"
        else:
            common = [a for a in wanted if a in info.audiences] if wanted else info.audiences
            if wanted and not common:
                status["error"] = "token audiences do not match"
            else:
                status = {
                    "authenticated": True,
                    "audiences": list(common),
                    "user": {
                        "username": (
                            f"system:serviceaccount:{info.namespace}:{info.service_account}"
                        ),
                        "groups": ["system:serviceaccounts", "system:authenticated"],
                    },
                }
        self.requests.append("TOKENREVIEW")
        return web.json_response({**review, "status": status}, status=201)


def _selector(request: web.Request) -> Callable[[dict[str, Any]], bool]:
    """The request's labelSelector and fieldSelector (and its namespace, for a namespaced
    watch) as one predicate."""
    labels = _parse_selector(request.query.get("labelSelector", ""))
    fields = _parse_selector(request.query.get("fieldSelector", ""))
    namespace = request.match_info.get("namespace")

    def selects(obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        values = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace")}
        if namespace is not None and meta.get("namespace") != namespace:
            return False
        return _selects(labels, obj) and all(
            (values.get(k) == v) == (op == "=") for k, op, v in fields
        )

    return selects


def _parse_selector(text: str) -> list[tuple[str, str, str]]:
    """Equality-based label selector terms: (key, "=" or "!=", value)."""
    out = []
    for term in (t.strip() for t in text.split(",") if t.strip()):
        if "!=" in term:
            k, v = term.split("!=", 1)
            out.append((k.strip(), "!=", v.strip()))
        else:
            k, _, v = term.replace("==", "=").partition("=")
            out.append((k.strip(), "=", v.strip()))
    return out


def _selects(selector: list[tuple[str, str, str]], obj: dict[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all((labels.get(k) == v) == (op == "=") for k, op, v in selector)


def _not_found(plural: str, name: str) -> web.Response:
    return _status(404, "NotFound", f'{_display(plural)} "{name}" not found')


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null removes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge_patch(out.get(k), v)
    return out


def _gone() -> dict[str, Any]:
    return {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "too old resource version",
            "reason": "Expired",
            "code": 410,
        },
    }


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


async def _send(resp: web.StreamResponse, event: dict[str, Any]) -> None:
    await resp.write(json.dumps(event).encode() + b"\n")


def pod(
    name: str,
    ip: str,
    labels: dict[str, str],
    *,
    namespace: str = "default",
    service_account: str = "default",
    ready: bool = True,
    node: str = "node-1",
) -> dict[str, Any]:
    """A Pod object as the API server returns it for a running pod."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "uid": name},
        "spec": {
            "nodeName": node,
            "serviceAccountName": service_account,
            "containers": [{"name": "app", "image": "app", "ports": [{"containerPort": 8080}]}],
        },
        "status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def node(name: str, labels: dict[str, str], heartbeat: str = "") -> dict[str, Any]:
    """A Node object, with the parts of its status that change on every heartbeat."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "uid": name},
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": heartbeat}],
            "images": [{"names": ["registry.example/app:1"], "sizeBytes": 1000}],
        },
    }
