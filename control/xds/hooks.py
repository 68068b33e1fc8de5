"""What the ADS server is handed by the rest of the control plane, and the contract of each:
the stream authorizer, the connect/disconnect hooks, the subscription guards, and the source
of generated resources.
The server calls out only through these; nothing it is handed may call back into it except
through `push_all`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

import grpc

from control.ca.identity import Identity
from control.model.proxy import Proxy
from control.xds.cache import ResourceSet


class StreamRefused(Exception):
    """Raised by a StreamAuthorizer to end a stream with this status and message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# Decides whether a stream may go on once its node is known, and who the caller is: returns
# the authenticated identity (None: an unauthenticated stream, the plaintext port) or raises
# StreamRefused (the TLS port authenticates the caller and checks that the node claims the
# caller's own identity). Contract: called once per stream, before admission and before
# `on_connect`; it may be async (Kubernetes mode asks the API server about tokens) and must
# not call back into the server.
StreamAuthorizer = Callable[
    [grpc.aio.ServicerContext, Proxy], Identity | Awaitable[Identity | None] | None
]
# `on_connect(proxy, identity)` / `on_disconnect(proxy, identity)`: a stream of that proxy was
# admitted / ended; `identity` is what the authorizer returned for it (None: unauthenticated).
# Contract: called on the event loop, once each per admitted stream, in that order; they
# must return at once (no I/O) and must not call back into the server: a change they cause
# reaches the streams as a later push (`push_all`).
StreamHook = Callable[[Proxy, Identity | None], None]
# `on_health(proxy, identity, error)`: the stream's agent reported its workload's health
# (Istio's `istio.io/health` DiscoveryRequest; `error` None: healthy, else the reason).
# `proxy` and `identity` are the stream's own (its first request's node, what the authorizer
# returned), never anything the report claims. Same contract as StreamHook.
HealthHook = Callable[[Proxy, Identity | None, str | None], None]
# `guard(proxy, identity, names)`: a request of a guarded type (the server is handed one guard
# per type URL: SDS, control/secretaccess.py) names these resources; raising StreamRefused
# ends that stream, and only that one, with its status. `proxy` and `identity` are the
# stream's own, as for StreamHook. Contract: called on the event loop for every request of
# its type, before the request is applied (so nothing of a refused subscription is ever
# sent); it must return at once (no I/O) and must not call back into the server.
SubscriptionGuard = Callable[[Proxy, Identity | None, Sequence[str]], None]


def health_error(req: Any) -> str | None:
    """The reason of a health report, or None when it says healthy (no error_detail)."""
    if not req.HasField("error_detail"):
        return None
    detail = req.error_detail
    return str(detail.message) or f"unhealthy (code {detail.code})"


class ResourceSource(Protocol):
    """What the server needs from the rest of the control plane: the generated resources.

    Contract: both calls are cheap reads of the newest push's state, answered on the event
    loop without I/O; `resources` returns a set for every type asked (empty when the proxy
    gets none) and never calls back into the server. The server calls them from its send
    workers; the source tells the server of new state only through `push_all`."""

    def resources(self, proxy: Proxy, type_urls: Iterable[str]) -> dict[str, ResourceSet]:
        """Current resource sets of the given types for one proxy."""
        ...

    def push_started_at(self) -> float:
        """Monotonic time at which the current resources' push started."""
        ...
