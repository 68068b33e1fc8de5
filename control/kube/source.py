"""Mesh config from the Kubernetes API: the same MeshConfig the file watcher builds.

One list+watch (`Reflector`) per resource: Services, Pods, EndpointSlices, Namespaces, Secrets
(gateway certificates), the Istio kinds we support (networking.istio.io and security.istio.io,
version v1) and the Gateway API kinds (gateway.networking.k8s.io), whose status is written
back (gatewaystatus.py). Services, Secrets and Istio objects go through the same kind
converters as YAML files; Pods become workloads (pod IP, labels, service account, named
container ports); Services without a selector take their
endpoints from their EndpointSlices (endpointslices.py). `start()` returns once every resource has
been listed (readiness waits for the initial sync); afterwards changes are merged after a short
quiet period and `on_change` is called when the MeshConfig differs. An object that fails to
convert is reported once and its previous good version stays in use, as with a bad file.

`KubeSource` implements `control.config.source.ConfigSource`, as `ConfigWatcher` does, so the
control plane uses either one the same way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from control.config import kinds
from control.config.delivery import WarningLog, deliver
from control.config.errors import ConfigError
from control.config.kinds.gatewayapi import KINDS as GATEWAY_API_KINDS
from control.config.manifest import RawObject, in_revision
from control.config.merge import merge
from control.config.objects import ConfigObject, FileConfig
from control.gatewayapi.translate import Translator
from control.kube.client import KubeClient, KubeConfig
from control.kube.endpointslices import slice_endpoints, slices_by_service
from control.kube.gatewaystatus import StatusWriter
from control.kube.reflector import Key, Reflector
from control.kube.watchloop import WatchSpec, reflect
from control.kube.workloads import SOURCE_FILE, node_topology, pod_workload
from control.model.types import (
    ConfigWarning,
    MeshConfig,
    labels_of,
)
from pilotfish_common.lifecycle import Lifecycle
from pilotfish_common.tasks import cancel

logger = logging.getLogger(__name__)

OnChange = Callable[[MeshConfig], Awaitable[None] | None]


@dataclass(frozen=True, slots=True)
class Resource:
    kind: str
    api_version: str  # "v1" or "group/version"
    plural: str
    # Kinds whose name another group uses too (the Gateway API's Gateway) are known by
    # `Kind.group`; the others by their kind.
    qualified: bool = False

    @property
    def base(self) -> str:
        prefix = "/api/" if "/" not in self.api_version else "/apis/"
        return f"{prefix}{self.api_version}"

    @property
    def path(self) -> str:
        return f"{self.base}/{self.plural}"

    @property
    def key(self) -> str:
        group = self.api_version.rpartition("/")[0]
        return f"{self.kind}.{group}" if self.qualified else self.kind


SERVICES = Resource("Service", "v1", "services")
PODS = Resource("Pod", "v1", "pods")
NAMESPACES = Resource("Namespace", "v1", "namespaces")
ENDPOINT_SLICES = Resource("EndpointSlice", "discovery.k8s.io/v1", "endpointslices")
# Gateway certificates (kind converter control/config/kinds/secret.py; other Secrets skipped).
SECRETS = Resource("Secret", "v1", "secrets")
# Where pods run (Istio reads a pod's locality from its node's topology labels).
NODES = Resource("Node", "v1", "nodes")

_ISTIO_GROUPS = ("networking.istio.io", "security.istio.io", "telemetry.istio.io")


def _plural(kind: str) -> str:
    lower = kind.lower()
    if lower.endswith("y") and lower[-2:-1] not in ("a", "e", "o", "u"):
        return lower[:-1] + "ies"  # policies; but gateways
    return lower + "s"


def istio_resources() -> list[Resource]:
    """Every Istio kind a converter exists for, at the group's v1 version."""
    out = []
    for kind, entries in sorted(kinds.CONVERTERS.items()):
        groups = {v.split("/")[0] for versions, _ in entries for v in versions if "/" in v}
        for group in _ISTIO_GROUPS:
            if group in groups:
                out.append(Resource(kind, f"{group}/v1", _plural(kind)))
    return out


def gateway_api_resources() -> list[Resource]:
    """Every Gateway API kind, at the first version its converter accepts."""
    return [
        Resource(kind, versions[0], plural, qualified=True)
        for (_, kind), (versions, _, plural) in sorted(GATEWAY_API_KINDS.items())
    ]


def _with_slice_endpoints(
    obj: ConfigObject, slices: Iterable[Mapping[str, Any]], pods: Mapping[Key, Mapping[str, Any]]
) -> ConfigObject:
    """A Service without a selector takes its endpoints from its EndpointSlices."""
    if not slices or not any(s.selector is None for s in obj.services):
        return obj
    endpoints = slice_endpoints(slices, pods)
    services = tuple(
        dataclasses.replace(s, static_endpoints=endpoints) if s.selector is None else s
        for s in obj.services
    )
    return dataclasses.replace(obj, services=services)


# Istio's `type` label for its registry informers (kube controller's registerHandlers).
_REGISTRY_TYPES = {
    "Service": "Services",
    "Pod": "Pods",
    "Namespace": "Namespaces",
    "EndpointSlice": "EndpointSlice",
    "Node": "Nodes",
}


def _events_of(
    resource: Resource, on_events: Callable[[str, str, str, int], None]
) -> Callable[[str, int], None]:
    registry = _REGISTRY_TYPES.get(resource.kind)
    source, kind = ("registry", registry) if registry else ("config", resource.kind)
    return lambda event, n: on_events(source, kind, event, n)


class KubeSource(Lifecycle):
    """Keeps `current` in sync with the API server. `async with KubeSource(...)`."""

    def __init__(
        self,
        config: KubeConfig,
        on_change: OnChange | None = None,
        *,
        domain: str = "cluster.local",
        revision: str = "",
        debounce: float = 0.05,
        watch_timeout: int = 300,
        page_size: int = 500,
        on_events: Callable[[str, str, str, int], None] | None = None,
    ) -> None:
        """`on_events(source, type, event, n)`: n objects of `type` were added, updated or
        deleted; source "registry" for Services, Pods, Namespaces, Nodes and EndpointSlices,
        "config" for Istio kinds (Istio's pilot_k8s_reg_events and pilot_k8s_cfg_events)."""
        self.config = config
        self.client = KubeClient(config)
        self._handlers: list[OnChange] = [] if on_change is None else [on_change]
        self.domain = domain
        self.revision = revision  # Istio config labelled for another istio.io/rev is left out
        self.debounce = debounce
        self.watch_timeout = watch_timeout
        self.page_size = page_size
        self.resources = [
            SERVICES,
            PODS,
            NAMESPACES,
            ENDPOINT_SLICES,
            SECRETS,
            NODES,
            *istio_resources(),
            *gateway_api_resources(),
        ]
        self.reflectors = {r.key: Reflector() for r in self.resources}
        self.reflectors[NODES.key].keep = node_topology
        if on_events is not None:
            for r in self.resources:
                self.reflectors[r.key].on_events = _events_of(r, on_events)
        gateway_api = {r.kind: r for r in self.resources if r.qualified}
        self.status_writer = StatusWriter(
            self.client,
            {kind: (r.base, r.plural) for kind, r in gateway_api.items()},
            lambda kind: self.reflectors[gateway_api[kind].key].store,
        )
        self.current = MeshConfig()
        self.errors: dict[str, ConfigError] = {}
        self.reloads = 0
        self._good: dict[tuple[str, Key], tuple[str, ConfigObject]] = {}  # by (kind, key)
        # Keeps the last Gateway API translation: a rebuild translates the routes it changed.
        self._translator = Translator()
        self._warnings = WarningLog(logger)
        self._wake = asyncio.Event()
        self._synced = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every list+watch and wait for the initial list of each (readiness)."""
        await self.client.start()
        for r in self.resources:
            self._tasks.append(asyncio.create_task(self._reflect(r), name=f"kube-{r.plural}"))
        await self._synced.wait()
        self.current = self._build()
        self._warnings.update(self.current.warnings)
        await self.status_writer.start()
        self.status_writer.update(self.current.gateway_api_status)
        self._tasks.append(asyncio.create_task(self._merge_loop(), name="kube-merge"))
        logger.info(
            "kubernetes config synced from %s: %d services, %d pods as workloads",
            self.config.server,
            len(self.current.services),
            len(self.current.workload_entries),
        )

    async def close(self) -> None:
        tasks, self._tasks = self._tasks, []
        await cancel(*tasks)
        await self.status_writer.close()
        await self.client.close()

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        """The labels of a namespace as last seen; None when it is not known (yet)."""
        ns = self.reflectors[NAMESPACES.kind].store.get(("", namespace))
        if ns is None:
            return None
        labels = (ns.get("metadata") or {}).get("labels") or {}
        return {str(k): str(v) for k, v in labels.items()}

    @property
    def files(self) -> list[str]:
        return [SOURCE_FILE]

    @property
    def kube_client(self) -> KubeClient:
        return self.client

    @property
    def snapshot_at(self) -> None:
        """Watch events carry no time at which the API server's state was read."""
        return None

    def subscribe(self, handler: OnChange) -> None:
        """Hand every later config to `handler` too (after the ones already subscribed)."""
        self._handlers.append(handler)

    def status(self) -> Mapping[str, object]:
        return {
            "kubernetes": self.config.server,
            "resources": {
                kind: {
                    "objects": len(r.store),
                    "resourceVersion": r.resource_version,
                    "synced": r.synced,
                    "relists": r.relists,
                }
                for kind, r in self.reflectors.items()
            },
            "errors": {k: str(e) for k, e in sorted(self.errors.items())},
            "reloads": self.reloads,
        }

    # --- list+watch ------------------------------------------------------------------------

    async def _reflect(self, resource: Resource) -> None:
        r = self.reflectors[resource.key]

        def listed() -> None:
            self._changed(r)
            self._mark_synced()

        # A kind whose CRD is not installed counts as empty; it is looked for again later.
        spec = WatchSpec(resource.path, "", self.page_size, self.watch_timeout, missing_retry=30)
        await reflect(self.client, r, spec, on_listed=listed, on_event=lambda: self._changed(r))

    def _changed(self, r: Reflector) -> None:
        if r.changed:
            r.changed = False
            self._wake.set()

    def _mark_synced(self) -> None:
        if all(r.synced for r in self.reflectors.values()):
            self._synced.set()

    # --- building the MeshConfig -----------------------------------------------------------

    async def _merge_loop(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(self.debounce)  # let a burst of events land together
            self._wake.clear()
            try:
                merged = self._build()
            except Exception:
                logger.exception("building config from the Kubernetes API failed")
                continue
            previous, self.current = self.current, merged
            self._warnings.update(self.current.warnings)
            self.status_writer.update(merged.gateway_api_status)
            if merged != previous:
                self.reloads += 1
                for handler in self._handlers:
                    await deliver(handler, merged, logger)

    def _build(self) -> MeshConfig:
        objects: list[ConfigObject] = []
        warnings: list[ConfigWarning] = []
        errors: dict[str, ConfigError] = {}
        seen: set[tuple[str, Key]] = set()
        slices = slices_by_service(self.reflectors[ENDPOINT_SLICES.kind].store.values())
        pods = self.reflectors[PODS.kind].store
        nodes = self.reflectors[NODES.kind].store
        for resource in self.resources:
            store = self.reflectors[resource.key].store
            for key in sorted(store):
                obj = store[key]
                if resource is PODS:
                    node = nodes.get(("", str((obj.get("spec") or {}).get("nodeName") or "")))
                    wl = pod_workload(obj, node["metadata"]["labels"] if node else None)
                    if wl is not None:
                        objects.append(ConfigObject(wl.source, obj, workloads=(wl,)))
                    continue
                if resource in (NAMESPACES, ENDPOINT_SLICES, NODES):
                    continue  # read through the Services and the webhook
                converted = self._convert(resource, key, obj, errors)
                if converted is not None:
                    seen.add((resource.key, key))
                    obj_out, obj_warnings = converted
                    if resource is SERVICES:
                        obj_out = _with_slice_endpoints(obj_out, slices.get(key, ()), pods)
                    objects.append(obj_out)
                    warnings.extend(obj_warnings)
        for gone in set(self._good) - seen:
            del self._good[gone]
        self._set_errors(errors)
        files = [FileConfig(SOURCE_FILE, tuple(objects), tuple(dict.fromkeys(warnings)))]
        return merge(
            files,
            namespace_labels=lambda ns: labels_of(self.namespace_labels(ns)),
            translator=self._translator,
        )

    def _convert(
        self,
        resource: Resource,
        key: Key,
        obj: Mapping[str, Any],
        errors: dict[str, ConfigError],
    ) -> tuple[ConfigObject, tuple[ConfigWarning, ...]] | None:
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        cached = self._good.get((resource.key, key))
        if cached is not None and cached[0] == rv:
            return cached[1], ()
        raw = RawObject(
            file=SOURCE_FILE,
            line=0,
            api_version=str(obj.get("apiVersion") or resource.api_version),
            kind=resource.kind,
            namespace=key[0] or "default",
            name=key[1],
            # List items carry no apiVersion/kind; the converters read the whole object.
            data={**obj, "apiVersion": resource.api_version, "kind": resource.kind},
            lines={},
        )
        if not in_revision(raw, self.revision):
            return None
        try:
            converted = kinds.convert(raw, self.domain)
        except ConfigError as e:
            errors[f"{resource.kind} {key[0]}/{key[1]}"] = e
            return (cached[1], ()) if cached is not None else None
        if converted.object is None:
            return None
        self._good[(resource.key, key)] = (rv, converted.object)
        return converted.object, converted.warnings

    def _set_errors(self, errors: dict[str, ConfigError]) -> None:
        for name, err in sorted(errors.items()):
            if self.errors.get(name) != err:
                logger.error("%s (keeping its last good version, if any)", err)
        self.errors = dict(sorted(errors.items()))
