"""What every generator receives: the push's index, the shared cache and a per-push memo."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

from google.protobuf.message import Message

from control.generate.conflicts import Conflicts
from control.model.index import MeshIndex
from control.xds.cache import Resource, ResourceCache

T = TypeVar("T")


class GenContext:
    """One push's generation state.

    `resource()` goes through the long-lived cache (serialize once per input version, rule 8);
    `memo()` shares work between proxies within this push (e.g. the outbound clusters of every
    proxy that sees the same services are computed once).

    Made with `previous` (the context of the push before) and an index derived from that
    push's index (MeshIndex.next), `changed` names the services whose endpoints may differ
    and `previous_memo()` offers what the previous push computed, so a generator can patch
    its previous answer instead of recomputing it (the outbound plan, the EDS set): an
    endpoint change then costs what changed, not the size of the mesh.
    """

    def __init__(
        self, index: MeshIndex, cache: ResourceCache, previous: GenContext | None = None
    ) -> None:
        self.index = index
        self.cache = cache
        self._memo: dict[Hashable, object] = {}
        # Met while generating this push (the pilot_conflict_* gauges read them).
        self.conflicts = Conflicts()
        self.changed: frozenset[str] | None = None
        # Only the previous memo is kept, never the previous context: that would chain every
        # push's memo to the one before it.
        self._previous: dict[Hashable, object] = {}
        if previous is not None:
            self.changed = index.changed_since(previous.index)
            if self.changed is not None:
                self._previous = previous._memo

    def resource(
        self,
        type_url: str,
        name: str,
        key: Hashable,
        build: Callable[[], Message],
        variant: Hashable = None,
    ) -> Resource:
        return self.cache.get(type_url, name, key, build, variant)

    def memo(self, key: Hashable, compute: Callable[[], T]) -> T:
        if key in self._memo:
            return self._memo[key]  # type: ignore[return-value]
        value = compute()
        self._memo[key] = value
        return value

    def previous_memo(self, key: Hashable) -> object | None:
        """What the previous push memoized under `key`, when this push is incremental over
        it (`changed` is not None); else None. Keys made of id()s stay sound across the two
        pushes only for objects both indexes share (see MeshIndex.next)."""
        return self._previous.get(key)


def next_context(previous: GenContext, index: MeshIndex) -> GenContext:
    """The generation state for the push after `previous`, with the index of the new snapshot
    (made by `previous.index.next(...)`). The cache's generation advances and stale entries
    are swept, as on every push; entries that an incremental push reuses from the previous
    one without asking the cache are marked in use by the generator that reuses them."""
    previous.cache.next_generation()
    previous.cache.sweep()
    return GenContext(index, previous.cache, previous)


def variant_resource(
    ctx: GenContext, type_url: str, name: str, key: Hashable, build: Callable[[], Message]
) -> Resource:
    """A resource whose content under one name legitimately differs between proxies: inbound
    clusters that point at each pod's IP, RDS routes that depend on the client's namespace.
    Each content variant gets its own cache slot (the key is the variant), so proxies with
    equal inputs share bytes and alternating proxies do not evict each other (rule 8)."""
    return ctx.resource(type_url, name, key, build, variant=key)
