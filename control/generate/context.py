"""What every generator receives: the push's index, the shared cache and a per-push memo."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

from google.protobuf.message import Message

from control.generate.conflicts import Conflicts
from control.model.index import IndexChange, MeshIndex
from control.model.peer import ConnectedPeer
from control.xds.cache import Resource, ResourceCache

T = TypeVar("T")
_MISSING = object()


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

    When rules changed too, `change` says which config slices did (MeshIndex.change_since):
    `previous_memo(key, depends=...)` still offers the previous answer when none of the
    slices it `depends` on changed, and `carried()` keeps values from push to push for as
    long as every push asks for them and says they still hold (the route translation of
    an unchanged VirtualService), so a one-route change costs that route.
    """

    def __init__(
        self,
        index: MeshIndex,
        cache: ResourceCache,
        previous: GenContext | None = None,
        peers: tuple[ConnectedPeer, ...] = (),
    ) -> None:
        self.index = index
        # Connected proxies that the agents' peer table names besides the index's workloads
        # (control/registry/peers.py).
        self.peers = peers
        self.cache = cache
        # ResourceCache.get itself: (type URL, name, key, build, variant) -> Resource.
        self.resource = cache.get
        self._memo: dict[Hashable, object] = {}
        # Met while generating this push (the pilot_conflict_* gauges read them).
        self.conflicts = Conflicts()
        self.changed: frozenset[str] | None = None
        self.change: IndexChange | None = None
        # Only the previous memos are kept, never the previous context: that would chain
        # every push's memo to the one before it.
        self._previous: dict[Hashable, object] = {}
        # What this push carries on (carried()), and what the previous push carried: a value
        # not asked for in a push is gone after it.
        self._carried: dict[Hashable, object] = {}
        self._carried_before: dict[Hashable, object] = {}
        if previous is not None:
            self.change = index.change_since(previous.index)
            self.changed = index.changed_since(previous.index)
            if self.change is not None:
                self._previous = previous._memo
                self._carried_before = previous._carried

    def memo(self, key: Hashable, compute: Callable[[], T]) -> T:
        if key in self._memo:
            return self._memo[key]  # type: ignore[return-value]
        value = compute()
        self._memo[key] = value
        return value

    def previous_memo(self, key: Hashable, depends: frozenset[str] | None = None) -> object | None:
        """What the previous push memoized under `key`, when this push is incremental over
        it: by default when only endpoints changed (`changed` is not None); with `depends`
        (RULE_SLICES names), when none of those slices changed (endpoint changes are the
        caller's to patch: `change.endpoints`). Else None. Keys made of id()s stay sound
        across the two pushes only for objects both indexes share (see MeshIndex.next)."""
        if depends is None:
            return self._previous.get(key) if self.changed is not None else None
        if self.change is None or self.change.touches(depends):
            return None
        return self._previous.get(key)

    def unchanged(self, slices: frozenset[str]) -> bool:
        """Whether this push is incremental over the previous one and none of `slices`
        (RULE_SLICES names) changed between them."""
        return self.change is not None and not self.change.touches(slices)

    def carried(self, key: Hashable, compute: Callable[[], T], holds: Callable[[T], bool]) -> T:
        """`memo()` across pushes: the value the previous push carried under `key` when
        `holds(value)` says the inputs it was made from are still this push's, else
        `compute()`. Every push that wants the value must ask for it (what nobody asks for
        is dropped after one push), so `holds` only has to judge what changed since the
        previous push. The key must name every input that `holds` does not check."""

        def renew(old: T | None) -> T:
            return old if old is not None and holds(old) else compute()

        return self.renewed(key, renew)

    def renewed(self, key: Hashable, renew: Callable[[T | None], T]) -> T:
        """The value carried under `key` for this push: `renew(previous)`, where previous is
        what the previous push carried under it (None: nothing), once per push. For state
        that is patched from push to push (a table whose entries are checked one by one)."""
        found = self._carried.get(key, _MISSING)
        if found is not _MISSING:
            return found  # type: ignore[return-value]
        value = renew(self._carried_before.get(key))  # type: ignore[arg-type]
        self._carried[key] = value
        return value


def next_context(
    previous: GenContext, index: MeshIndex, peers: tuple[ConnectedPeer, ...] = ()
) -> GenContext:
    """The generation state for the push after `previous`, with the index of the new snapshot
    (made by `previous.index.next(...)`). The cache's generation advances and stale entries
    are swept, as on every push; entries that an incremental push reuses from the previous
    one without asking the cache are marked in use by the generator that reuses them."""
    previous.cache.next_generation()
    previous.cache.sweep()
    return GenContext(index, previous.cache, previous, peers)


def variant_resource(
    ctx: GenContext, type_url: str, name: str, key: Hashable, build: Callable[[], Message]
) -> Resource:
    """A resource whose content under one name legitimately differs between proxies: inbound
    clusters that point at each pod's IP, RDS routes that depend on the client's namespace.
    Each content variant gets its own cache slot (the key is the variant), so proxies with
    equal inputs share bytes and alternating proxies do not evict each other (rule 8)."""
    return ctx.resource(type_url, name, key, build, variant=key)
