"""Delta (incremental) ADS stream rules, sans-IO.

Like `sotw.SotwStream`, `DeltaStream` takes DeltaDiscoveryRequests and resource sets and
returns decisions. The stream tracks, per type, which version of each resource the client
holds (from what we sent, or from `initial_resource_versions` on reconnect), so a push sends
only resources whose version differs and names the ones that went away in
`removed_resources` (wire rule 7). Subscription changes are applied whatever the nonce says;
the first request for a wildcard type is always answered, even with nothing in it, because
Envoy waits for it to finish initialising. A NACKed resource version is never re-sent: the
client still has our record of it, so only a new version goes out (rule 2).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest

from control.xds.cache import DeltaChange, Resource, ResourceSet, Selection
from control.xds.state import (
    COUNT_STRINGS,
    WILDCARD,
    RequestKind,
    RequestOutcome,
    StreamRules,
    SyncStatus,
    ordered,
    shared_outcome,
    sync_status,
)
from protos import typeurls

_MAX_OUTSTANDING = 32


@dataclass(frozen=True, slots=True)
class DeltaResponse:
    type_url: str
    system_version_info: str
    nonce: str
    resources: tuple[Resource, ...]
    removed: tuple[str, ...]
    # Set when the response sends exactly this selection and removes nothing (a new
    # stream's first answer): its encoding can be shared (Selection.framed).
    selection: Selection | None = None
    # Set when the response is a change shared with other streams: so is its encoding.
    change: DeltaChange | None = None


@functools.lru_cache(maxsize=4096)
def _shared(names: frozenset[str]) -> frozenset[str]:
    """One copy of each distinct subscription (the first one seen), shared by every stream
    that has it: a thousand proxies subscribing to the same thousand assignments hold one
    set."""
    return names


@dataclass(slots=True)
class _TypeState:
    type_url: str
    names: frozenset[str] = frozenset()  # shared (see _shared); replaced, never modified
    explicit_wildcard: bool = False
    legacy_wildcard: bool = False
    # name -> version the client holds, as far as we know. After an answer that brought the
    # client in line with a ResourceSet this is that set's Selection.versions, shared by
    # every stream in the same place (client_shared): copy it before changing it (_own).
    client_has: dict[str, str] = field(default_factory=dict)
    client_shared: bool = False
    # The client may hold names outside the subscription (its legacy wildcard ended, or it
    # claimed them on reconnect): then client_has is its own, never a selection's.
    beyond: bool = False
    # Names we told the client do not exist (so we say it once, not on every push).
    # (Usually empty: the shared empty frozenset, replaced when it changes.)
    told_absent: frozenset[str] = frozenset()
    # Nonces sent, not yet (N)ACKed, oldest first. Usually none or one: a tuple (the empty
    # one is shared) costs a fraction of a set on each of thousands of streams.
    outstanding: tuple[str, ...] = ()
    sent_nonce: str = ""
    sent_version: str = ""
    acked_nonce: str = ""
    nack_message: str = ""
    nacked_nonce: str = ""
    ever_sent: bool = False
    # seq of the ResourceSet the client's view (client_has, told_absent) matches over this
    # subscription, 0 when unknown: a push then only looks at the names that changed since
    # (ResourceSet.changed_since) instead of every subscribed name.
    synced: int = 0

    @property
    def wildcard(self) -> bool:
        return self.explicit_wildcard or (self.legacy_wildcard and not self.names)

    def own(self) -> dict[str, str]:
        """client_has, made this stream's own before it is changed."""
        if self.client_shared:
            self.client_has = dict(self.client_has)
            self.client_shared = False
        return self.client_has

    def resource_count(self) -> int:
        return len(self.client_has)

    def status(self) -> SyncStatus:
        # Synced once nothing sent is waiting for its (N)ACK.
        return sync_status(self, self.ever_sent, not self.outstanding)


class DeltaStream(StreamRules[_TypeState]):
    """The rules of one delta ADS stream. Not thread-safe; drive it from one task."""

    __slots__ = ("_version",)

    def __init__(self, stream_id: str = "") -> None:
        super().__init__(stream_id)
        self._version = 0

    def receive(self, req: DeltaDiscoveryRequest, raw: bytes | None = None) -> RequestOutcome:
        """Classify a request and apply its subscription changes. (`raw`, the request's
        bytes, is for SotwStream's sake: a delta request carries only what changed.)"""
        self.requests += 1
        type_url = sys.intern(req.type_url)  # one copy per type, not one per stream
        st = self._types.get(type_url)
        first = st is None
        if st is None:
            st = _TypeState(type_url)
            self._types[type_url] = st
            # An empty first subscribe list is the legacy wildcard (spec: "wildcard mode").
            st.legacy_wildcard = not req.resource_names_subscribe
            st.client_has.update(req.initial_resource_versions)
        elif not req.resource_names_subscribe and not req.resource_names_unsubscribe:
            # No subscription change (every ACK): only the nonce counts.
            return self._answered(st, req, False)

        # Not interned one by one (a new Envoy names a thousand clusters, and a storm brings
        # thousands of Envoys): the subscription kept is the shared set (_shared), so every
        # stream with the same names holds one copy of them.
        subscribe = set(req.resource_names_subscribe)
        unsubscribe = set(req.resource_names_unsubscribe)
        if subscribe or unsubscribe:
            st.synced = 0  # the scope changes: the next answer looks at everything
        was_wildcard = st.wildcard
        # Subscription changes apply whatever the nonce (rule 7).
        if WILDCARD in subscribe:
            st.explicit_wildcard = True
            subscribe.discard(WILDCARD)
        if WILDCARD in unsubscribe:
            st.explicit_wildcard = False
            st.legacy_wildcard = False
            unsubscribe.discard(WILDCARD)
        dropped_wildcard = WILDCARD in req.resource_names_unsubscribe
        added = subscribe - st.names
        if subscribe or unsubscribe:
            st.names = _shared((st.names | subscribe) - unsubscribe)
        if dropped_wildcard and not st.wildcard:
            # The client forgets what it held only through the wildcard; so do we, so that a
            # later "*" sends those resources again.
            st.client_has = {n: v for n, v in st.client_has.items() if n in st.names}
            st.client_shared = False
        if subscribe:
            # Legacy wildcard holds only until the client names a resource (xDS spec).
            st.legacy_wildcard = False
        for name in unsubscribe:
            # The client drops what it unsubscribes from; forget it so a later subscribe resends.
            if name in st.client_has:
                st.own().pop(name)
        if st.told_absent and (unsubscribe or added):
            st.told_absent = st.told_absent - unsubscribe - added
        scope_shrank = was_wildcard or (first and bool(req.initial_resource_versions))
        if scope_shrank and not st.wildcard and not st.beyond:
            # The legacy wildcard ended (what it brought stays with the client), or the client
            # claims resources on reconnect: does it hold any outside its subscription?
            st.beyond = any(n not in st.names for n in st.client_has)
        if st.wildcard and not was_wildcard:
            added.add(WILDCARD)  # newly subscribed to everything: answer it (rule 4)

        if first:
            return shared_outcome(type_url, RequestKind.INITIAL, True)
        return self._answered(st, req, bool(added))

    def _answered(
        self, st: _TypeState, req: DeltaDiscoveryRequest, must_respond: bool
    ) -> RequestOutcome:
        """The request's nonce: an ACK or NACK of a response outstanding, or not."""
        type_url = st.type_url
        nonce = req.response_nonce
        if not nonce:
            return shared_outcome(type_url, RequestKind.UPDATE, must_respond)
        # Ours, not the client's copy: that would be one more string per stream, where ours
        # is shared (see CountStrings).
        outstanding = st.outstanding
        ours = next((n for n in outstanding if n == nonce), None)
        if ours is None:
            # Stale or unknown nonce: only the subscription change counts.
            return shared_outcome(type_url, RequestKind.STALE, must_respond)
        nonce = ours
        # Usually the only one outstanding.
        st.outstanding = (
            () if len(outstanding) == 1 else tuple(n for n in outstanding if n is not ours)
        )
        if req.HasField("error_detail"):
            self.nacks += 1
            st.nack_message = req.error_detail.message or f"code {req.error_detail.code}"
            st.nacked_nonce = nonce
            return RequestOutcome(
                type_url, RequestKind.NACK, must_respond=must_respond, error_message=st.nack_message
            )
        self.acks += 1
        st.acked_nonce = nonce
        if nonce == st.sent_nonce:
            st.nack_message = ""
            st.nacked_nonce = ""
        return shared_outcome(type_url, RequestKind.ACK, must_respond)

    def respond(
        self,
        type_url: str,
        resources: Mapping[str, Resource],
        *,
        force: bool = False,
        allow_removals: bool = True,
    ) -> DeltaResponse | None:
        """What changed for one type since the client last heard from us, or None.

        `force` sends a response even when empty (first request). `allow_removals=False`
        holds removals back for a later call (make-before-break for clusters).
        """
        st = self._types.get(type_url)
        if st is None:
            return None
        rs = resources if isinstance(resources, ResourceSet) else None
        scope = None if st.wildcard else st.names
        changed = rs.changed_since(st.synced) if rs is not None and st.synced else None
        updates: Sequence[Resource]
        removed: Sequence[str]
        selection: Selection | None = None
        change: DeltaChange | None = None
        shared = st.client_shared and not st.beyond
        if rs is not None and changed is not None and allow_removals and shared:
            # The client holds exactly the selection of the set numbered st.synced (never
            # `beyond` it: client_has is then its own): what it lacks depends on where it
            # stands alone, so the streams that stand there share the answer and its bytes.
            key = (st.synced, st.wildcard, st.names, st.told_absent)
            found = changed
            change = rs.change(key, lambda: DeltaChange(*_difference(st, rs, found, True)))
            updates, removed = change.resources, change.removed
        elif changed is None and rs is not None and not st.client_has:
            # The client holds nothing (a new stream): all of the selection, worked out once
            # for every stream with this subscription.
            selection = rs.selection(scope)
            updates = selection.resources
            absent = selection.absent if scope is not None else st.names - rs.keys()
            # A subscribed name that does not exist is reported removed once, so the client
            # stops waiting for it (it stays subscribed and arrives when it appears).
            removed = sorted(absent - st.told_absent) if allow_removals else ()
        else:
            updates, removed = _difference(st, resources, changed, allow_removals)
        # What the client will hold matches `resources` over the subscription, unless
        # removals were held back.
        in_line = allow_removals and rs is not None
        st.synced = rs.seq if in_line and rs is not None else 0
        if in_line and rs is not None and not st.beyond:
            # Exactly the selection's versions: refer to them instead of keeping a copy.
            st.client_has, st.client_shared = rs.selection(scope).versions, True
        elif updates or removed:
            client_has = st.own()
            for res in updates:
                client_has[res.name] = res.version
            for name in removed:
                client_has.pop(name, None)
        for name in removed:
            if name in st.names:
                st.told_absent = st.told_absent | {name}
        if not updates and not removed and not force:
            return None
        self._version += 1
        nonce = self._nonces.next()
        # A client that never ACKs must not grow this without bound; the oldest nonces are
        # the ones it can no longer usefully answer.
        st.outstanding = (*st.outstanding, nonce)[-_MAX_OUTSTANDING:]
        st.sent_nonce = nonce
        # Streams count alike, so thousands hold the same few version strings.
        st.sent_version = COUNT_STRINGS.get(self._version)
        st.ever_sent = True
        return DeltaResponse(
            type_url,
            st.sent_version,
            nonce,
            tuple(updates),
            tuple(removed),
            selection if selection is not None and not removed else None,
            change,
        )

    def push(self, sets: Mapping[str, Mapping[str, Resource]]) -> list[DeltaResponse]:
        """Responses for a push, clusters and endpoints first, cluster removals last."""
        out: list[DeltaResponse] = []
        hold_cds = typeurls.CLUSTER in sets and any(
            t in self._types for t in (typeurls.LISTENER, typeurls.ROUTE)
        )
        cds_state = self._types.get(typeurls.CLUSTER)
        had_clusters = (
            set(cds_state.client_has)
            if cds_state is not None and typeurls.CLUSTER in sets
            else set()
        )
        for type_url in ordered(sets):
            if type_url not in self._types:
                continue
            resp = self.respond(
                type_url,
                sets[type_url],
                allow_removals=not (hold_cds and type_url == typeurls.CLUSTER),
            )
            if resp is not None:
                out.append(resp)
                if type_url == typeurls.CLUSTER:
                    self._resend_endpoints_of(resp, had_clusters)
        if hold_cds and typeurls.CLUSTER in self._types:
            resp = self.respond(typeurls.CLUSTER, sets[typeurls.CLUSTER])
            if resp is not None:
                out.append(resp)
        return out

    def _resend_endpoints_of(self, cds: DeltaResponse, had: set[str]) -> None:
        """Envoy warms an updated EDS cluster until an assignment for it arrives (or its
        initial fetch timeout, 15 s, passes): forget that the client has the assignments of
        the clusters this CDS response updates (clusters it `had`; new ones get theirs
        anyway), so they are sent again even when unchanged; the EDS response of the same
        push follows. Not while EDS stands NACKed: rule 2 forbids re-sending it unchanged."""
        eds = self._types.get(typeurls.ENDPOINT)
        if eds is None or not eds.client_has or eds.nack_message:
            return
        eds.synced = 0  # the client's view is ours no longer
        for res in cds.resources:
            if res.name in had and res.name in eds.client_has:
                eds.own().pop(res.name)

    def client_versions(self, type_url: str) -> dict[str, str]:
        return dict(self._types[type_url].client_has)


def _difference(
    st: _TypeState,
    resources: Mapping[str, Resource],
    changed: frozenset[str] | None,
    allow_removals: bool,
) -> tuple[tuple[Resource, ...], tuple[str, ...]]:
    """What the client of `st` lacks of `resources` (by name), and the names to tell it are
    removed: of every name in scope, or only of those `changed` since the set the client
    holds (the same rules, applied to fewer names)."""
    gone: set[str] | frozenset[str]
    absent: set[str] | frozenset[str]
    candidates: set[str] | frozenset[str]
    if changed is None:
        # Everything in scope: the client may lack any of it.
        candidates = set(resources) | st.names if st.wildcard else st.names
        gone = st.client_has.keys() - resources.keys()
        absent = st.names - resources.keys()
    else:
        candidates = changed if st.wildcard else changed & st.names
        gone = {n for n in changed if n in st.client_has and n not in resources}
        absent = {n for n in changed & st.names if n not in resources}
    client_has = st.client_has
    updates = []
    for name in sorted(candidates):
        res = resources.get(name)
        if res is not None and client_has.get(name) != res.version:
            updates.append(res)
    removed: list[str] = []
    if allow_removals:
        removed = sorted(gone)
        # A subscribed name that does not exist is reported removed once, so the client
        # stops waiting for it (it stays subscribed and arrives when it appears).
        removed.extend(sorted(absent - st.told_absent - gone))
    return tuple(updates), tuple(removed)
