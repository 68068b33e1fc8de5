"""The other control-plane replicas' proxy rows, for the proxies view in Kubernetes mode.

Each replica only knows the streams connected to it; `pilotfish-ctl proxy-status` shows them
all by asking every replica for its syncz over xDS (control/ctl/status.py). The dashboard
asks the same way: the replicas are the running pods of the control-plane Deployment in its
own namespace (label selector, default Istio's `app=istiod`; control/ctl/discover.py's
`replica_addresses`), each asked on the plaintext xDS port every replica listens on. The
answer is kept for `ttl` seconds, so several viewers polling every second fan out once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from urllib.parse import quote

import aiohttp

from control.ctl.discover import replica_addresses
from control.ctl.status import ProxyRow, gather_status
from control.kube.client import ApiError, KubeClient

logger = logging.getLogger(__name__)

DEFAULT_SELECTOR = "app=istiod"

# The replicas' xDS addresses (HOST:PORT), or a one-line reason they could not be found.
FindReplicas = Callable[[], Awaitable[list[str]]]


class ReplicaLookupError(Exception):
    pass


def kube_replicas(
    client: Callable[[], KubeClient | None], namespace: str, selector: str, port: Callable[[], int]
) -> FindReplicas:
    """The control-plane pods through the API server the control plane already talks to."""

    async def find() -> list[str]:
        kube = client()
        if kube is None:
            raise ReplicaLookupError("no Kubernetes client")
        try:
            pods, _ = await kube.list_all(
                f"/api/v1/namespaces/{quote(namespace, safe='')}/pods", label_selector=selector
            )
        except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as e:
            raise ReplicaLookupError(f"cannot list control-plane pods: {e}") from None
        return replica_addresses(pods, port())

    return find


class ReplicaRows:
    def __init__(
        self,
        find: FindReplicas,
        own_id: str,
        *,
        timeout: float = 2.0,
        ttl: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._find = find
        self._own_id = own_id
        self._timeout = timeout
        self._ttl = ttl
        self._clock = clock
        self._cached: tuple[float, list[ProxyRow], list[str]] | None = None
        self._lock = asyncio.Lock()

    async def __call__(self) -> tuple[list[ProxyRow], list[str]]:
        """Rows of every other replica, and the replicas (or the lookup) that failed."""
        async with self._lock:
            now = self._clock()
            if self._cached is not None and now - self._cached[0] < self._ttl:
                return self._cached[1], self._cached[2]
            try:
                addresses = await self._find()
            except ReplicaLookupError as e:
                rows: list[ProxyRow] = []
                errors = [str(e)]
            else:
                found, failed = await gather_status(addresses, self._timeout)
                # This replica's own rows come from its own syncz, in-process.
                rows = [r for r in found if r.replica != self._own_id]
                errors = [str(f) for f in failed]
            self._cached = (self._clock(), rows, errors)
            return rows, errors
