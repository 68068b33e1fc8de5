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

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest

from control.xds.cache import Resource, ResourceSet
from control.xds.state import (
    NonceSource,
    RequestKind,
    RequestOutcome,
    SyncStatus,
    TypeStatus,
    ordered,
)
from protos import typeurls

WILDCARD = "*"
_MAX_OUTSTANDING = 32


def _nonce_order(nonce: str) -> tuple[int, str]:
    return (int(nonce), nonce) if nonce.isdigit() else (-1, nonce)


@dataclass(frozen=True, slots=True)
class DeltaResponse:
    type_url: str
    system_version_info: str
    nonce: str
    resources: tuple[Resource, ...]
    removed: tuple[str, ...]


@dataclass(slots=True)
class _TypeState:
    type_url: str
    names: set[str] = field(default_factory=set)
    explicit_wildcard: bool = False
    legacy_wildcard: bool = False
    # name -> version the client holds, as far as we know.
    client_has: dict[str, str] = field(default_factory=dict)
    # Names we told the client do not exist (so we say it once, not on every push).
    told_absent: set[str] = field(default_factory=set)
    outstanding: set[str] = field(default_factory=set)  # nonces sent, not yet (N)ACKed
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

    def status(self) -> SyncStatus:
        if not self.ever_sent:
            return SyncStatus.NOT_SENT
        if self.nack_message and self.nacked_nonce == self.sent_nonce:
            return SyncStatus.ERROR
        if not self.outstanding:
            return SyncStatus.SYNCED
        return SyncStatus.STALE


class DeltaStream:
    """The rules of one delta ADS stream. Not thread-safe; drive it from one task."""

    __slots__ = ("_nonces", "_types", "_version", "acks", "nacks", "requests", "stream_id")

    def __init__(self, stream_id: str = "") -> None:
        self.stream_id = stream_id
        self._types: dict[str, _TypeState] = {}
        self._nonces = NonceSource()
        self._version = 0
        self.requests = 0
        self.acks = 0
        self.nacks = 0

    def receive(self, req: DeltaDiscoveryRequest) -> RequestOutcome:
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
        st.names |= subscribe
        st.names -= unsubscribe
        if dropped_wildcard and not st.wildcard:
            # The client forgets what it held only through the wildcard; so do we, so that a
            # later "*" sends those resources again.
            st.client_has = {n: v for n, v in st.client_has.items() if n in st.names}
        if subscribe:
            # Legacy wildcard holds only until the client names a resource (xDS spec).
            st.legacy_wildcard = False
        for name in unsubscribe:
            # The client drops what it unsubscribes from; forget it so a later subscribe resends.
            st.client_has.pop(name, None)
            st.told_absent.discard(name)
        st.told_absent -= added
        if st.wildcard and not was_wildcard:
            added.add(WILDCARD)  # newly subscribed to everything: answer it (rule 4)

        if first:
            return RequestOutcome(type_url, RequestKind.INITIAL, must_respond=True)
        nonce = req.response_nonce
        if not nonce:
            return RequestOutcome(type_url, RequestKind.UPDATE, must_respond=bool(added))
        if nonce not in st.outstanding:
            # Stale or unknown nonce: only the subscription change above counts.
            return RequestOutcome(type_url, RequestKind.STALE, must_respond=bool(added))
        st.outstanding.discard(nonce)
        if req.HasField("error_detail"):
            self.nacks += 1
            st.nack_message = req.error_detail.message or f"code {req.error_detail.code}"
            st.nacked_nonce = nonce
            return RequestOutcome(
                type_url, RequestKind.NACK, must_respond=bool(added), error_message=st.nack_message
            )
        self.acks += 1
        st.acked_nonce = nonce
        if nonce == st.sent_nonce:
            st.nack_message = ""
            st.nacked_nonce = ""
        return RequestOutcome(type_url, RequestKind.ACK, must_respond=bool(added))

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
        changed = (
            resources.changed_since(st.synced)
            if st.synced and isinstance(resources, ResourceSet)
            else None
        )
        candidates: set[str] | frozenset[str]
        if changed is None:
            # Everything in scope: the client may lack any of it.
            candidates = set(resources) | st.names if st.wildcard else st.names
            gone: set[str] | frozenset[str] = st.client_has.keys() - resources.keys()
            absent = st.names - resources.keys()
        else:
            # The client holds the set numbered st.synced: only names changed since can
            # differ (the same rules, applied to fewer names).
            candidates = changed if st.wildcard else changed & st.names
            gone = {n for n in changed if n in st.client_has and n not in resources}
            absent = {n for n in changed & st.names if n not in resources}
        updates: list[Resource] = []
        removed: list[str] = []
        client_has = st.client_has
        for name in sorted(candidates):
            res = resources.get(name)
            if res is not None and client_has.get(name) != res.version:
                updates.append(res)
        if allow_removals:
            removed = sorted(gone)
            # A subscribed name that does not exist is reported removed once, so the client
            # stops waiting for it (it stays subscribed and arrives when it appears).
            removed.extend(sorted(absent - st.told_absent - gone))
        # What the client will hold matches `resources` over the subscription, unless
        # removals were held back.
        st.synced = resources.seq if allow_removals and isinstance(resources, ResourceSet) else 0
        if not updates and not removed and not force:
            return None
        for res in updates:
            st.client_has[res.name] = res.version
        for name in removed:
            st.client_has.pop(name, None)
            if name in st.names:
                st.told_absent.add(name)
        self._version += 1
        nonce = self._nonces.next()
        st.outstanding.add(nonce)
        if len(st.outstanding) > _MAX_OUTSTANDING:
            # A client that never ACKs must not grow this set without bound; the oldest
            # nonces are the ones it can no longer usefully answer.
            st.outstanding = set(sorted(st.outstanding, key=_nonce_order)[-_MAX_OUTSTANDING:])
        st.sent_nonce = nonce
        st.sent_version = str(self._version)
        st.ever_sent = True
        return DeltaResponse(type_url, st.sent_version, nonce, tuple(updates), tuple(removed))

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
            if res.name in had:
                eds.client_has.pop(res.name, None)

    @property
    def subscribed_types(self) -> list[str]:
        return list(self._types)

    def client_versions(self, type_url: str) -> dict[str, str]:
        return dict(self._types[type_url].client_has)

    def status(self) -> list[TypeStatus]:
        return [
            TypeStatus(
                type_url=t,
                status=st.status(),
                sent_version=st.sent_version,
                sent_nonce=st.sent_nonce,
                acked_nonce=st.acked_nonce,
                last_nack=st.nack_message,
                resource_count=len(st.client_has),
            )
            for t, st in self._types.items()
        ]
