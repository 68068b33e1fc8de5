"""Publishes our CA root as the ConfigMap `istio-ca-root-cert` (key `root-cert.pem`) in every
namespace, as istiod's namespace controller does: injected sidecars mount it to verify the
control plane, so it must exist in a namespace before the first pod there starts.

Two list+watches (sans-IO `Reflector`s) keep what we know current: Namespaces, and the
ConfigMaps named `istio-ca-root-cert` cluster-wide (a field selector, so we never hold every
ConfigMap of the cluster). Any change — a new namespace, someone editing or deleting the
ConfigMap — wakes the publisher, which compares every namespace with what it should hold and
writes only the differences; a periodic resync retries writes that failed.

Writes are safe with several replicas, each running this with the same root. An update carries
the resourceVersion we read, so the API server applies only one of two racing updates and
answers the other 409 Conflict; a create that loses answers 409 AlreadyExists. Either way the
loser reads the object again, finds it already right and stops (no write, so no new conflict
for the winner): they converge. An update answered 404 (deleted meanwhile) becomes a create.

`plan`, `recovery`, `publishes_to` and `pending` are sans-IO; `RootCertPublisher` is the
asyncio adapter.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import enum
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from control.kube.client import ApiError, KubeClient
from control.kube.reflector import Key, Reflector
from control.kube.retry import ConflictRetry
from control.kube.watchloop import WatchSpec, reflect
from pilotfish_common.lifecycle import Lifecycle
from pilotfish_common.tasks import cancel

logger = logging.getLogger(__name__)

CONFIGMAP_NAME = "istio-ca-root-cert"
DATA_KEY = "root-cert.pem"
# Istio labels the objects it publishes this way; tools select on it.
CONFIG_LABEL = "istio.io/config"
# Istio's defaults (inject.IgnoredNamespaces, which its namespace controller skips):
# system namespaces never run mesh workloads.
DEFAULT_EXCLUDED = frozenset(
    ("kube-system", "kube-public", "kube-node-lease", "local-path-storage")
)
NAMESPACES_PATH = "/api/v1/namespaces"
CONFIGMAPS_PATH = "/api/v1/configmaps"
FIELD_SELECTOR = f"metadata.name={CONFIGMAP_NAME}"


class Verb(enum.Enum):
    CREATE = "create"
    UPDATE = "update"


class Recovery(enum.Enum):
    REREAD = "reread"  # 409: stale or already exists; read it again and plan again
    CREATE = "create"  # 404 on update: deleted meanwhile
    GIVE_UP = "give-up"  # anything else; the next resync tries again


class Outcome(enum.Enum):
    UP_TO_DATE = "up-to-date"
    CREATED = "created"
    UPDATED = "updated"
    FAILED = "failed"


def configmap_path(namespace: str) -> str:
    return f"{NAMESPACES_PATH}/{namespace}/configmaps/{CONFIGMAP_NAME}"


@dataclass(frozen=True, slots=True)
class Write:
    verb: Verb
    namespace: str
    body: Mapping[str, Any]

    @property
    def path(self) -> str:
        if self.verb is Verb.CREATE:
            return f"{NAMESPACES_PATH}/{self.namespace}/configmaps"
        return configmap_path(self.namespace)


def new_configmap(namespace: str, root_pem: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": CONFIGMAP_NAME,
            "namespace": namespace,
            "labels": {CONFIG_LABEL: "true"},
        },
        "data": {DATA_KEY: root_pem},
    }


def plan(namespace: str, current: Mapping[str, Any] | None, root_pem: str) -> Write | None:
    """The write that makes `current` (None: absent) what it should be; None when it is.

    An update keeps everything else in the object (other keys and labels someone added, as
    Istio does) and its resourceVersion, which makes the PUT conditional."""
    if current is None:
        return Write(Verb.CREATE, namespace, new_configmap(namespace, root_pem))
    meta = current.get("metadata") or {}
    data = current.get("data") or {}
    if data.get(DATA_KEY) == root_pem and (meta.get("labels") or {}).get(CONFIG_LABEL) == "true":
        return None
    body = copy.deepcopy(dict(current))
    body["apiVersion"], body["kind"] = "v1", "ConfigMap"
    body_meta = body["metadata"] = dict(body.get("metadata") or {})
    body_meta["labels"] = {**(body_meta.get("labels") or {}), CONFIG_LABEL: "true"}
    body_meta.setdefault("name", CONFIGMAP_NAME)
    body_meta.setdefault("namespace", namespace)
    body["data"] = {**(body.get("data") or {}), DATA_KEY: root_pem}
    return Write(Verb.UPDATE, namespace, body)


def recovery(write: Write, status: int) -> Recovery:
    """What to do after the API server refused `write` with `status`."""
    if status == 409:
        return Recovery.REREAD
    if status == 404 and write.verb is Verb.UPDATE:
        return Recovery.CREATE
    # 404 on create: the namespace is gone; 403: terminating namespace or missing RBAC;
    # 422/400: the object is refused. None of these is fixed by trying again at once.
    return Recovery.GIVE_UP


def publishes_to(namespace: Mapping[str, Any], excluded: frozenset[str]) -> bool:
    meta = namespace.get("metadata") or {}
    if str(meta.get("name") or "") in excluded or not meta.get("name"):
        return False
    # A terminating namespace refuses new objects (403); its ConfigMap goes with it.
    terminating = (namespace.get("status") or {}).get("phase") == "Terminating"
    return not (terminating or meta.get("deletionTimestamp"))


def pending(
    namespaces: Iterable[Mapping[str, Any]],
    configmaps: Mapping[Key, Mapping[str, Any]],
    root_pem: str,
    excluded: frozenset[str],
) -> list[str]:
    """The namespaces whose ConfigMap is missing or differs, in name order."""
    out = []
    for ns in namespaces:
        if not publishes_to(ns, excluded):
            continue
        name = str(ns["metadata"]["name"])
        if plan(name, configmaps.get((name, CONFIGMAP_NAME)), root_pem) is not None:
            out.append(name)
    return sorted(out)


class RootCertPublisher(Lifecycle):
    """`async with RootCertPublisher(client, root_pem)`: keeps the ConfigMap in every
    namespace not in `excluded`; `start()` does not wait for the first sync."""

    def __init__(
        self,
        client: KubeClient,
        root_pem: str,
        *,
        excluded: Iterable[str] = DEFAULT_EXCLUDED,
        resync: float = 60.0,
        retry: ConflictRetry | None = None,
        max_attempts: int = 8,
        watch_timeout: int = 300,
    ) -> None:
        self.client = client
        self.root_pem = root_pem
        self.excluded = frozenset(excluded)
        self.resync = resync
        self.retry = retry or ConflictRetry()
        self.max_attempts = max_attempts
        self.watch_timeout = watch_timeout
        self.namespaces = Reflector()
        self.configmaps = Reflector()
        self.creates = 0
        self.updates = 0
        self.conflicts = 0
        self.last: dict[str, Outcome] = {}  # by namespace
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        if self._tasks:
            return
        self._tasks = [
            asyncio.create_task(
                self._reflect(self.namespaces, NAMESPACES_PATH, ""), name="root-cert-namespaces"
            ),
            asyncio.create_task(
                self._reflect(self.configmaps, CONFIGMAPS_PATH, FIELD_SELECTOR),
                name="root-cert-configmaps",
            ),
            asyncio.create_task(self._loop(), name="root-cert-publish"),
        ]

    async def close(self) -> None:
        tasks, self._tasks = self._tasks, []
        await cancel(*tasks)

    def pending(self) -> list[str]:
        """Namespaces to write, from what the watches last showed; none before both listed
        (a half-listed view would create ConfigMaps that already exist)."""
        if not (self.namespaces.synced and self.configmaps.synced):
            return []
        return pending(
            self.namespaces.store.values(), self.configmaps.store, self.root_pem, self.excluded
        )

    async def sync(self, namespace: str) -> Outcome:
        """Write the namespace's ConfigMap until it is ours (or give up until the resync)."""
        current = self.configmaps.store.get((namespace, CONFIGMAP_NAME))
        self.retry.reset()
        for _ in range(self.max_attempts):
            write = plan(namespace, current, self.root_pem)
            if write is None:
                return self._done(namespace, Outcome.UP_TO_DATE, current)
            try:
                if write.verb is Verb.CREATE:
                    written = await self.client.create(write.path, write.body)
                    self.creates += 1
                else:
                    written = await self.client.replace(write.path, write.body)
                    self.updates += 1
                logger.info("namespace %s: %s %s", namespace, write.verb.value, CONFIGMAP_NAME)
                return self._done(
                    namespace,
                    Outcome.CREATED if write.verb is Verb.CREATE else Outcome.UPDATED,
                    written,
                )
            except ApiError as e:
                step = recovery(write, e.status)
                if step is Recovery.GIVE_UP:
                    self._log_failure(namespace)(
                        "namespace %s: %s %s: %s", namespace, write.verb.value, CONFIGMAP_NAME, e
                    )
                    return self._done(namespace, Outcome.FAILED, None)
                if step is Recovery.CREATE:
                    current = None
                    continue
                self.conflicts += 1
                # Jittered, so that two replicas that keep colliding drift apart.
                await asyncio.sleep(self.retry.next_delay())
                try:
                    current = await self.client.get(configmap_path(namespace))
                except ApiError as e2:
                    if e2.status != 404:
                        self._log_failure(namespace)(
                            "namespace %s: reading %s: %s", namespace, CONFIGMAP_NAME, e2
                        )
                        return self._done(namespace, Outcome.FAILED, None)
                    current = None
        self._log_failure(namespace)(
            "namespace %s: %s still conflicting; next try at the resync", namespace, CONFIGMAP_NAME
        )
        return self._done(namespace, Outcome.FAILED, None)

    def _log_failure(self, namespace: str) -> Callable[..., None]:
        """Warn once per failure streak: a lasting refusal (RBAC without configmaps) would
        otherwise log every namespace at every wake-up."""
        return logger.debug if self.last.get(namespace) is Outcome.FAILED else logger.warning

    def _done(self, namespace: str, outcome: Outcome, seen: Mapping[str, Any] | None) -> Outcome:
        self.last[namespace] = outcome
        if seen is not None:
            # What we wrote or read is newer than the watch's copy until its event arrives;
            # without this a wake-up in between would plan the same write again (a
            # conflict, harmless but wasted).
            self.configmaps.store[(namespace, CONFIGMAP_NAME)] = seen
        return outcome

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.resync):
                    await self._wake.wait()
            self._wake.clear()
            for namespace in self.pending():
                try:
                    await self.sync(namespace)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # aiohttp.ClientError, OSError: the resync retries
                    self._log_failure(namespace)(
                        "namespace %s: %s: %r", namespace, CONFIGMAP_NAME, e
                    )
                    self.last[namespace] = Outcome.FAILED
            for gone in [ns for ns in self.last if ("", ns) not in self.namespaces.store]:
                del self.last[gone]  # deleted namespaces: not kept forever

    async def _reflect(self, r: Reflector, path: str, field_selector: str) -> None:
        def listed() -> None:
            # Always: the first list of the second resource can change nothing in its store
            # yet make `pending` (which waits for both) answer at last.
            r.changed = False
            self._wake.set()

        spec = WatchSpec(path, field_selector, watch_timeout=self.watch_timeout)
        await reflect(self.client, r, spec, on_listed=listed, on_event=lambda: self._changed(r))

    def _changed(self, r: Reflector) -> None:
        if r.changed:
            r.changed = False
            self._wake.set()
