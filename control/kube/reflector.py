"""List+watch of one Kubernetes resource, as a sans-IO state machine (client-go's Reflector).

    r = Reflector()
    r.listed(items, resource_version)        # after GET ...?limit= (all pages)
    for line in watch stream: r.event(json)  # GET ...?watch=1&resourceVersion=r.resource_version
                                             #     &allowWatchBookmarks=true

`event()` answers what to do next: CONTINUE (the store may have changed: `changed`), RELIST
(410 Gone: our resourceVersion is too old; list again, which replaces the store, so objects
deleted meanwhile disappear and nothing is lost). A watch that ends normally is re-opened from
`resource_version` (resume); errors back off with `Backoff`. `synced` turns true after the
first complete list, which is what the source's readiness waits for. `on_events`, when set, is
told how many objects each list or event added, updated or deleted ("add", "update",
"delete"), as informers count them for Istio's pilot_k8s_*_events.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pilotfish_common import backoff

Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects


class Next(enum.Enum):
    CONTINUE = "continue"
    RELIST = "relist"


class WatchError(Exception):
    """The server sent a watch event we cannot use (other than 410 Gone)."""


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def resource_version_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


@dataclass
class Reflector:
    store: dict[Key, Mapping[str, Any]] = field(default_factory=dict)
    resource_version: str = ""
    synced: bool = False
    changed: bool = False  # set when the store changed; the owner clears it
    relists: int = 0
    bookmarks: int = 0
    on_events: Callable[[str, int], None] | None = field(default=None, compare=False)
    # What of an object to keep (None: all of it). An update that changes nothing kept
    # leaves the store, and `changed`, alone: a Node's heartbeats are not config changes.
    keep: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = field(
        default=None, compare=False
    )

    def listed(self, items: Iterable[Mapping[str, Any]], resource_version: str) -> None:
        """A complete list: it replaces the store (objects absent from it are gone)."""
        keep = self.keep
        store = {key_of(o): o if keep is None else keep(o) for o in items}
        if store != self.store:
            self.changed = True
            if self.on_events is not None:
                self._count_list(store)
        self.store = store
        self.resource_version = resource_version
        if self.synced:
            self.relists += 1
        self.synced = True

    def _count_list(self, store: Mapping[Key, Mapping[str, Any]]) -> None:
        assert self.on_events is not None
        old = self.store
        counts = {
            "add": sum(1 for k in store if k not in old),
            "update": sum(1 for k, o in store.items() if k in old and old[k] != o),
            "delete": sum(1 for k in old if k not in store),
        }
        for event, n in counts.items():
            if n:
                self.on_events(event, n)

    def event(self, event: Mapping[str, Any]) -> Next:
        etype = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, Mapping):
            raise WatchError(f"watch event {etype!r} without an object")
        if etype == "ERROR":
            # A metav1.Status. 410 Gone (or reason Expired): the resourceVersion we resume
            # from was compacted away; only a fresh list is consistent.
            if obj.get("code") == 410 or obj.get("reason") in ("Expired", "Gone"):
                return Next.RELIST
            raise WatchError(f"watch error {obj.get('code')}: {obj.get('message', '')}")
        rv = resource_version_of(obj)
        if etype == "BOOKMARK":
            # No object change, only progress: resume from here next time.
            self.bookmarks += 1
        elif etype in ("ADDED", "MODIFIED"):
            key = key_of(obj)
            if self.keep is not None:
                obj = self.keep(obj)
            before = self.store.get(key)
            if before != obj:
                self.store[key] = obj
                self.changed = True
                if self.on_events is not None:
                    self.on_events("add" if before is None else "update", 1)
        elif etype == "DELETED":
            if self.store.pop(key_of(obj), None) is not None:
                self.changed = True
                if self.on_events is not None:
                    self.on_events("delete", 1)
        else:
            raise WatchError(f"unknown watch event type {etype!r}")
        if rv:
            self.resource_version = rv
        return Next.CONTINUE


@dataclass
class Backoff(backoff.Backoff):
    """Delays between failed list/watch attempts: the shared backoff with the Kubernetes
    source's own defaults, which start sooner and cap lower than the agent's reconnects."""

    initial: float = 0.2
    maximum: float = 10.0
