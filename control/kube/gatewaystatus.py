"""Writing Gateway API status back to the API server (the status subresource).

The config source hands over the statuses of every build (`update`); a background task
compares each with the object as last seen by the watch and sends a JSON merge patch to
`.../<name>/status` only where it differs (control/gatewayapi/status.py decides). Until the
watch shows our own write, the same write is not sent again. A failed write is retried after
a backoff; an object that is gone is skipped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import aiohttp

from control.gatewayapi.status import patch
from control.kube.client import ApiError, KubeClient
from control.kube.reflector import Backoff, Key, resource_version_of
from control.model.gatewayapi import ObjectStatus
from pilotfish_common.lifecycle import Lifecycle
from pilotfish_common.tasks import cancel

logger = logging.getLogger(__name__)

# kind -> (collection path without namespace, e.g. /apis/gateway.networking.k8s.io/v1, plural)
Paths = Mapping[str, tuple[str, str]]
# kind -> the objects of that kind as the watch last saw them
Stores = Callable[[str], Mapping[Key, Mapping[str, Any]]]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class StatusWriter(Lifecycle):
    def __init__(
        self,
        client: KubeClient,
        paths: Paths,
        stores: Stores,
        *,
        now: Callable[[], str] = _now,
    ) -> None:
        self.client = client
        self.paths = paths
        self.stores = stores
        self.now = now
        self.writes = 0
        self.failures = 0
        self._desired: tuple[ObjectStatus, ...] = ()
        # (kind, namespace, name) -> (resourceVersion written over, status written)
        self._sent: dict[tuple[str, str, str], tuple[str, dict[str, Any]]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kube-gateway-status")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel(task)

    def update(self, statuses: tuple[ObjectStatus, ...]) -> None:
        """The statuses of the latest build; also called when only the objects changed (a
        write by someone else is answered with ours again)."""
        self._desired = statuses
        self._wake.set()

    async def _run(self) -> None:
        backoff = Backoff()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if await self.write_pending():
                backoff.reset()
                continue
            delay = backoff.next_delay()
            await asyncio.sleep(delay)
            self._wake.set()

    async def write_pending(self) -> bool:
        """Write every status that differs; False when a write failed (to retry)."""
        ok = True
        for status in self._desired:
            if status.kind not in self.paths:
                continue
            obj = self.stores(status.kind).get((status.namespace, status.name))
            if obj is None:
                continue  # not seen yet (or gone): the next build brings it
            ident = (status.kind, status.namespace, status.name)
            rv = resource_version_of(obj)
            body = patch(status, obj.get("status"), self.now())
            if body is None:
                continue
            sent = self._sent.get(ident)
            if sent is not None and sent[0] == rv and _same(sent[1], body["status"]):
                continue  # written; the watch has not shown it yet
            try:
                await self.client.merge_patch(self._path(status), body)
            except ApiError as e:
                if e.status == 404:
                    continue
                ok = False
                self.failures += 1
                logger.warning("writing status of %s %s/%s: %s", *ident, e)
                continue
            except (OSError, TimeoutError, aiohttp.ClientError) as e:
                ok = False
                self.failures += 1
                logger.warning("writing status of %s %s/%s: %s", *ident, e)
                continue
            self.writes += 1
            self._sent[ident] = (rv, body["status"])
        return ok

    def _path(self, status: ObjectStatus) -> str:
        base, plural = self.paths[status.kind]
        scope = f"/namespaces/{status.namespace}" if status.namespace else ""
        return f"{base}{scope}/{plural}/{status.name}/status"


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Equal but for the times stamped on conditions."""
    return bool(_untimed(a) == _untimed(b))


def _untimed(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _untimed(v) for k, v in value.items() if k != "lastTransitionTime"}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value
