"""Serialized-resource cache (DESIGN wire rule 8).

Each resource is serialized once per version of its inputs and the bytes are shared by every
proxy that receives it. A generator names the inputs of a resource with a hashable `key` (frozen
model objects); when the key is unchanged the cached bytes are reused, and when it changes the
resource is built and serialized once. The version of a resource is a digest of its bytes, so a
rebuild that produces identical bytes does not count as a change (rule 4).
"""

from __future__ import annotations

import hashlib
import itertools
import sys
import weakref
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from google.protobuf.message import Message

from protos import wire


@dataclass(frozen=True, slots=True)
class Resource:
    """One serialized xDS resource, ready to be placed in a response without re-encoding."""

    name: str
    version: str
    type_url: str
    any_bytes: bytes  # a serialized google.protobuf.Any
    # delta_field(), kept from its second use on (False: never asked; True: asked once).
    _delta_field: bytes | bool = field(default=False, compare=False, repr=False)

    def delta_field(self) -> bytes:
        """The resource as one element of DeltaDiscoveryResponse.resources (tag and length
        included): a delta response is these joined, whatever stream it is for.

        Kept once a second response needs it, so a resource many streams receive is encoded
        twice and then shared; one made for a single proxy (its own listeners) is sent once
        per version and would hold a second copy of its bytes for nothing, on every stream."""
        encoded = self._delta_field
        if isinstance(encoded, bytes):
            return encoded
        data = wire.delta_resource_field(self.name, self.version, self.any_bytes)
        # A cache, not state: the dataclass is frozen for everything else.
        object.__setattr__(self, "_delta_field", data if encoded else True)
        return data


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def view_version(by_name: Mapping[str, Resource]) -> str:
    """A version for a group of resources: a digest over their names and versions, so two
    proxies that receive the same resources see the same version_info."""
    # One update over the joined text: the same digest as feeding the parts one by one, in
    # a fraction of the time for the thousands of names an EDS set holds.
    text = "".join([f"{name}\0{by_name[name].version}\0" for name in sorted(by_name)])
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


_view_ids = itertools.count(1)
_set_ids = itertools.count(1)
# How many ancestors a set derived by `replace` remembers the differences to.
_LINEAGE = 8


class View:
    """An immutable selection of resources (what one SotW response holds), with its version,
    and the whole encoded response, shared by every stream that gets the same selection (see
    `framed`).

    Sharing the response bytes means sharing the nonce too: `nonce` is unique to this view in
    the process, so it still names exactly one response on any stream (a stream that is sent
    the same view twice gets a nonce of its own the second time, see SotwStream). A thousand
    streams pushed the same clusters then hold one copy of the bytes instead of a thousand.
    """

    __slots__ = (
        "__weakref__",
        "_framed",
        "_framed_for",
        "by_name",
        "nonce",
        "resources",
        "seq",
        "version",
    )

    def __init__(self, by_name: Mapping[str, Resource], version: str | None = None) -> None:
        self.by_name: Mapping[str, Resource] = by_name
        self.resources: tuple[Resource, ...] = tuple(by_name[n] for n in sorted(by_name))
        self.version: str = version if version is not None else view_version(by_name)
        self.seq: int = next(_view_ids)  # increasing: later views have larger numbers
        self.nonce: str = f"v{self.seq}"
        self._framed: bytes | None = None
        self._framed_for: tuple[str, bytes | None] | None = None

    @property
    def block(self) -> bytes:
        """The encoded `resources` field (for responses that carry a nonce of their own)."""
        return wire.resources_block(r.any_bytes for r in self.resources)

    def framed(self, type_url: str, control_plane: bytes | None) -> bytes:
        """The complete DiscoveryResponse with this view's own nonce.

        Kept from the second time it is asked for on, for the (type, control plane) it was
        first asked for (in a server the only one): a view that many streams get is encoded
        twice and then shared, while one made for a single proxy (its own listeners) is sent
        once and would otherwise hold a second copy of its resources' bytes for as long as
        the stream lasts. A view shared more widely (the empty set's) is framed afresh for
        the other types."""
        key = (type_url, control_plane)
        if self._framed is not None and self._framed_for == key:
            return self._framed
        data = wire.discovery_response_block(
            self.version, self.block, type_url, self.nonce, control_plane
        )
        if self._framed_for is None:
            self._framed_for = key
        elif self._framed_for == key:  # the second time: from now on shared
            self._framed = data
        return data

    def __len__(self) -> int:
        return len(self.by_name)


# Every live view by version. The version is a digest of the names and versions a view
# holds, so views with the same version hold the same resources: a selection made again (a
# push rebuilt an unchanged set, a new stream subscribed to what others have) reuses the view
# the streams already hold, and with it its encoded response. Without this, streams that
# connect at different times each keep an identical copy of their CDS and RDS responses.
# (Selections of different types never share a version, their resources' bytes differ; an
# empty selection looks the same whatever its type, so it is not shared: a stream must not
# get one view, and so one nonce, for two types.)
_live_views: weakref.WeakValueDictionary[str, View] = weakref.WeakValueDictionary()


class ResourceSet(Mapping[str, Resource]):
    """The resources of one type for one proxy (or a group of proxies that share them).

    Immutable after construction. `digest` identifies the whole set, so "did anything change"
    is one string comparison per stream on a push.
    """

    __slots__ = ("_by_name", "_changes", "_digest", "_selections", "_since", "_views", "seq")

    def __init__(self, resources: Mapping[str, Resource] | list[Resource] | tuple[Resource, ...]):
        if isinstance(resources, Mapping):
            self._by_name: dict[str, Resource] = dict(resources)
        else:
            self._by_name = {r.name: r for r in resources}
        self._digest: str | None = None
        self._views: dict[frozenset[str] | None, View] = {}
        self.seq: int = next(_set_ids)  # names this set (see changed_since)
        # seq of an ancestor -> names that differ between it and this set (see replace).
        self._since: dict[int, frozenset[str]] | None = None
        self._selections: dict[frozenset[str] | None, Selection] | None = None
        self._changes: dict[Hashable, DeltaChange] | None = None

    def view(self, names: frozenset[str] | None) -> View:
        """The resources among `names` (None: all of them), memoized per set of names, so
        proxies with the same subscription share the selection, its version and its bytes."""
        v = self._views.get(names)
        if v is None:
            if names is None:
                selected, version = self._by_name, self.digest
            else:
                by_name = self._by_name
                selected = {n: by_name[n] for n in names if n in by_name}
                version = view_version(selected)
            v = _live_views.get(version) if selected else None
            if v is None:
                v = View(selected, version)
                if selected:  # an empty view has the same version whatever its type
                    _live_views[version] = v
            if len(self._views) < 64:  # bounded: odd subscriptions are not worth keeping
                self._views[names] = v
        return v

    def selection(self, names: frozenset[str] | None) -> Selection:
        """What a delta subscription to `names` (None: everything) covers, worked out once per
        set and subscription and shared by every stream with that subscription."""
        memo = self._selections
        if memo is None:
            memo = self._selections = {}
        found = memo.get(names)
        if found is None:
            by_name = self._by_name
            if names is None:
                picked = [by_name[n] for n in sorted(by_name)]
                absent: frozenset[str] = frozenset()
            else:
                picked = [by_name[n] for n in sorted(names) if n in by_name]
                absent = frozenset(n for n in names if n not in by_name)
            found = Selection(tuple(picked), {r.name: r.version for r in picked}, absent)
            if len(memo) < 64:  # bounded, as views are
                memo[names] = found
        return found

    def change(self, key: Hashable, make: Callable[[], DeltaChange]) -> DeltaChange:
        """What a delta response moving a client to this set sends, worked out once per
        `key` (where the client stands: see DeltaStream.respond) and shared by every stream
        that stands there."""
        memo = self._changes
        if memo is None:
            memo = self._changes = {}
        found = memo.get(key)
        if found is None:
            found = make()
            if len(memo) < 64:  # bounded, as views are
                memo[key] = found
        return found

    def __getitem__(self, name: str) -> Resource:
        return self._by_name[name]

    def get(self, name: str, default: Resource | None = None) -> Resource | None:  # type: ignore[override]
        # The dict's own get: Mapping.get goes through __getitem__ and an exception handler,
        # and a delta push asks once per subscribed name of every stream.
        return self._by_name.get(name, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @property
    def digest(self) -> str:
        if self._digest is None:
            self._digest = view_version(self._by_name)
        return self._digest

    def versions(self) -> dict[str, str]:
        return {n: r.version for n, r in self._by_name.items()}

    def replace(self, changes: Mapping[str, Resource | None]) -> ResourceSet:
        """A new set: this one with `changes` applied (a resource replaces or adds the one
        of its name, None removes the name). Costs a dict copy, not a rebuild. The new set
        remembers which names differ from this one and from this one's recent ancestors."""
        new = ResourceSet(self._by_name)
        for name, res in changes.items():
            if res is None:
                new._by_name.pop(name, None)
            else:
                new._by_name[name] = res
        changed = frozenset(changes)
        since = {self.seq: changed}
        for seq, names in (self._since or {}).items():  # newest first
            if len(since) >= _LINEAGE:
                break
            since[seq] = names | changed
        new._since = since
        return new

    def changed_since(self, seq: int) -> frozenset[str] | None:
        """The names whose resource may differ (changed, added or removed) between the set
        numbered `seq` and this one: empty for this very set, a superset of the differences
        when this set was derived from that one by a few `replace` calls, None when unknown.
        A delta stream whose client holds exactly the set `seq` then looks at these names
        only, instead of every name it subscribes to."""
        if seq == self.seq:
            return frozenset()
        if self._since is None:
            return None
        return self._since.get(seq)


@dataclass(frozen=True, slots=True)
class Selection:
    """The part of a ResourceSet a delta subscription covers (ResourceSet.selection)."""

    resources: tuple[Resource, ...]  # by name
    # name -> version: a stream whose client holds exactly this selection refers to this
    # dict instead of a copy of its own (thousands of streams, thousands of names each).
    # Shared: never modified.
    versions: dict[str, str]
    absent: frozenset[str]  # names subscribed to that the set does not have
    # Whole responses carrying all of it, encoded once (see framed).
    _framed: dict[tuple[str, str, str, bytes | None], bytes] = field(
        default_factory=dict, compare=False, repr=False
    )

    def framed(
        self, type_url: str, system_version: str, nonce: str, control_plane: bytes | None
    ) -> bytes:
        """The DeltaDiscoveryResponse that sends all of the selection and removes nothing.
        New streams with the same subscription ask the same questions in the same order, so
        their first answers carry the same version and nonce (both count per stream) and
        share these bytes, as SotW streams share a view's; the encoding is not made afresh
        for each of thousands of connecting proxies."""
        key = (type_url, system_version, nonce, control_plane)
        found = self._framed.get(key)
        if found is None:
            found = wire.delta_discovery_response_block(
                system_version,
                b"".join([r.delta_field() for r in self.resources]),
                type_url,
                (),
                nonce,
                control_plane,
            )
            if len(self._framed) < 8:  # the first answers of a stream: a handful
                self._framed[key] = found
        return found


@dataclass(frozen=True, slots=True)
class DeltaChange:
    """The resources a delta response sends and the names it removes, shared by the streams
    whose clients stand in the same place (ResourceSet.change): their responses differ only
    in version and nonce, which count per stream and mostly agree, so the encoding is shared
    too (framed)."""

    resources: tuple[Resource, ...]
    removed: tuple[str, ...]
    _framed: dict[tuple[str, str, str, bytes | None], bytes] = field(
        default_factory=dict, compare=False, repr=False
    )
    _block: list[bytes] = field(default_factory=list, compare=False, repr=False)

    def framed(
        self, type_url: str, system_version: str, nonce: str, control_plane: bytes | None
    ) -> bytes:
        """The DeltaDiscoveryResponse: the resources' block is joined once, and whole
        responses are kept for the few (version, nonce) pairs streams reach together."""
        key = (type_url, system_version, nonce, control_plane)
        found = self._framed.get(key)
        if found is None:
            if not self._block:
                self._block.append(b"".join([r.delta_field() for r in self.resources]))
            found = wire.delta_discovery_response_block(
                system_version, self._block[0], type_url, self.removed, nonce, control_plane
            )
            if len(self._framed) < 8:
                self._framed[key] = found
        return found


EMPTY = ResourceSet(())


@dataclass(slots=True)
class _Entry:
    key: Hashable
    resource: Resource
    generation: int


class ResourceCache:
    """Long-lived cache of serialized resources, keyed by (type URL, name, variant).

    Not thread-safe: it is used from the event loop only. `sweep()` drops entries that no push
    has asked for during the last `keep` generations, so removed services do not leak.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str, Hashable], _Entry] = {}
        self.generation = 0
        self.serializations = 0  # how many times a resource was actually serialized

    def get(
        self,
        type_url: str,
        name: str,
        key: Hashable,
        build: Callable[[], Message],
        variant: Hashable = None,
    ) -> Resource:
        """The resource `name` built from inputs `key`, serialized only if `key` is new.

        `variant` separates resources that share a name but legitimately differ between
        proxies (an inbound cluster pointing at each pod's IP, routes that depend on the
        client's namespace): each variant has its own slot, so proxies that alternate do not
        evict each other's bytes.
        """
        return self.get_encoded(
            type_url, name, key, lambda: build().SerializeToString(deterministic=True), variant
        )

    def get_encoded(
        self,
        type_url: str,
        name: str,
        key: Hashable,
        encode: Callable[[], bytes],
        variant: Hashable = None,
    ) -> Resource:
        """`get` for a resource whose generator writes its bytes itself (a route table joined
        from its virtual hosts' encodings): `encode()` must give what serializing the message
        deterministically would."""
        slot = (type_url, name, variant)
        entry = self._entries.get(slot)
        if entry is not None and entry.key == key:
            entry.generation = self.generation
            return entry.resource
        value = encode()
        self.serializations += 1
        # Interned: streams record the versions they sent, and a resource rebuilt with the
        # same bytes (after a sweep) then shares the string.
        version = sys.intern(digest(value))
        if entry is not None and entry.resource.version == version:
            # Same bytes from new inputs: keep the old object so identity checks stay cheap.
            entry.key = key
            entry.generation = self.generation
            return entry.resource
        res = Resource(name, version, type_url, wire.any_bytes(type_url, value))
        self._entries[slot] = _Entry(key, res, self.generation)
        return res

    def keep(self, type_url: str, names: Iterable[str]) -> None:
        """Mark the (variant-less) entries of `names` as in use in this generation without
        asking for them: what an incremental push reuses from the previous push's answer,
        so that the sweep does not take them for abandoned."""
        entries, generation = self._entries, self.generation
        for name in names:
            entry = entries.get((type_url, name, None))
            if entry is not None:
                entry.generation = generation

    def keep_slots(self, type_url: str, slots: Iterable[tuple[str, Hashable]]) -> None:
        """`keep` for resources stored under a variant: `slots` are (name, variant) pairs."""
        entries, generation = self._entries, self.generation
        for name, variant in slots:
            entry = entries.get((type_url, name, variant))
            if entry is not None:
                entry.generation = generation

    def next_generation(self) -> int:
        self.generation += 1
        return self.generation

    def sweep(self, keep: int = 2) -> int:
        """Forget entries unused for `keep` generations; returns how many were dropped."""
        floor = self.generation - keep
        stale = [slot for slot, e in self._entries.items() if e.generation < floor]
        for slot in stale:
            del self._entries[slot]
        return len(stale)

    def __len__(self) -> int:
        return len(self._entries)
