"""State-of-the-world ADS stream rules, sans-IO.

`SotwStream` takes DiscoveryRequests and resource sets in and returns decisions out: how a
request was classified, and which responses (with which nonces) to write. It never touches a
socket or a clock of its own; `now` is passed in. The grpc.aio adapter in `server.py` owns
the I/O.

Rules (DESIGN "Wire rules"): a NACK is recorded and the same resources are never re-sent until
they change (2); a request whose nonce is not the last one sent for its type is stale and
ignored (3); a response is sent only when the client's view changed, except that newly
subscribed names are always answered (4); legacy and explicit wildcard are both understood and
names that do not exist yet stay subscribed until they appear (5); pushes go clusters,
endpoints, listeners, routes, and removed clusters are dropped only after the listeners and
routes that stopped using them (6).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest

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


@dataclass(frozen=True, slots=True)
class SotwResponse:
    type_url: str
    version_info: str
    nonce: str
    resources: tuple[Resource, ...]


@dataclass(slots=True)
class _TypeState:
    type_url: str
    names: set[str] = field(default_factory=set)
    legacy_wildcard: bool = False
    # What the last response held (name -> Resource) and its version string.
    sent: dict[str, Resource] | None = None
    sent_version: str = ""
    sent_nonce: str = ""
    acked_nonce: str = ""
    acked_version: str = ""
    nack_message: str = ""
    nacked_nonce: str = ""

    @property
    def wildcard(self) -> bool:
        return WILDCARD in self.names or (self.legacy_wildcard and not self.names)

    def view(self, resources: Mapping[str, Resource]) -> dict[str, Resource]:
        """The part of `resources` this subscription covers."""
        if self.wildcard:
            return dict(resources)
        return {n: resources[n] for n in self.names if n in resources}

    def status(self) -> SyncStatus:
        if self.sent is None:
            return SyncStatus.NOT_SENT
        if self.nack_message and self.nacked_nonce == self.sent_nonce:
            return SyncStatus.ERROR
        if self.acked_nonce == self.sent_nonce:
            return SyncStatus.SYNCED
        return SyncStatus.STALE


def view_version(view: Mapping[str, Resource]) -> str:
    """A version string for a whole response: a digest over the names and versions it holds,
    so two proxies that receive the same resources see the same version_info."""
    h = hashlib.blake2b(digest_size=8)
    for name in sorted(view):
        h.update(name.encode())
        h.update(b"\0")
        h.update(view[name].version.encode())
        h.update(b"\0")
    return h.hexdigest()


class SotwStream:
    """The rules of one SotW ADS stream. Not thread-safe; drive it from one task."""

    def __init__(self, stream_id: str = "") -> None:
        self.stream_id = stream_id
        self._types: dict[str, _TypeState] = {}
        self._nonces = NonceSource()
        self.requests = 0
        self.acks = 0
        self.nacks = 0

    # --- requests --------------------------------------------------------------------------

    def receive(self, req: DiscoveryRequest) -> RequestOutcome:
        """Classify a request and update the subscription it carries."""
        self.requests += 1
        type_url = req.type_url
        st = self._types.get(type_url)
        names = set(req.resource_names)
        if st is None:
            st = _TypeState(type_url, names=names, legacy_wildcard=not names)
            self._types[type_url] = st
            if req.error_detail.message or req.error_detail.code:
                # A NACK as the very first request (the client restarted mid-NACK): record it.
                st.nack_message = req.error_detail.message
            return RequestOutcome(type_url, RequestKind.INITIAL, must_respond=True)

        nonce = req.response_nonce
        if nonce and nonce != st.sent_nonce:
            return RequestOutcome(type_url, RequestKind.STALE, must_respond=False)
        if not nonce:
            # The client (re)starts this subscription, e.g. after it lost the stream's state:
            # answer with what it asks for whatever we believe it has.
            st.names = names
            # Legacy wildcard holds only while the client has never named a resource (xDS
            # spec); a later empty list unsubscribes from everything.
            st.legacy_wildcard = st.legacy_wildcard and not names
            st.sent = None
            return RequestOutcome(type_url, RequestKind.INITIAL, must_respond=True)

        added = names - st.names
        st.names = names
        if names:
            st.legacy_wildcard = False
        if req.HasField("error_detail"):
            self.nacks += 1
            st.nack_message = req.error_detail.message or f"code {req.error_detail.code}"
            st.nacked_nonce = nonce
            return RequestOutcome(
                type_url,
                RequestKind.NACK,
                must_respond=bool(added),
                error_message=st.nack_message,
            )
        self.acks += 1
        st.acked_nonce = nonce
        st.acked_version = req.version_info
        st.nack_message = ""
        st.nacked_nonce = ""
        return RequestOutcome(type_url, RequestKind.ACK, must_respond=bool(added))

    # --- responses -------------------------------------------------------------------------

    def respond(
        self, type_url: str, resources: Mapping[str, Resource], *, force: bool = False
    ) -> SotwResponse | None:
        """The response for one type, or None when the client's view did not change.

        `force` answers even an unchanged view (newly subscribed names, first request). A
        NACKed view is never re-sent unforced: the client has told us it rejects exactly it.
        """
        st = self._types.get(type_url)
        if st is None:
            return None  # never subscribed: nothing to send
        view = st.view(resources)
        version = (
            resources.digest
            if st.wildcard and isinstance(resources, ResourceSet)
            else view_version(view)
        )
        if not force and st.sent is not None and version == st.sent_version:
            return None
        return self._emit(st, view, version)

    def _emit(self, st: _TypeState, view: dict[str, Resource], version: str) -> SotwResponse:
        nonce = self._nonces.next()
        st.sent = view
        st.sent_version = version
        st.sent_nonce = nonce
        ordered_view = tuple(view[n] for n in sorted(view))
        return SotwResponse(st.type_url, version, nonce, ordered_view)

    def push(self, sets: Mapping[str, Mapping[str, Resource]]) -> list[SotwResponse]:
        """Responses for a push of new resource sets, in make-before-break order.

        When clusters disappear, the first CDS response keeps them (with the bytes the client
        already has) so listeners and routes can move off them first; a final CDS response
        then drops them.
        """
        out: list[SotwResponse] = []
        final_cds: Mapping[str, Resource] | None = None
        for type_url in ordered(sets):
            st = self._types.get(type_url)
            if st is None:
                continue
            resources = sets[type_url]
            if type_url == typeurls.CLUSTER and st.sent is not None:
                view = st.view(resources)
                removed = {n: r for n, r in st.sent.items() if n not in view}
                if removed and _others_change(self, sets):
                    transitional = {**removed, **view}
                    resp = self._respond_view(st, transitional)
                    if resp is not None:
                        out.append(resp)
                    final_cds = resources
                    continue
            resp = self.respond(type_url, resources)
            if resp is not None:
                out.append(resp)
        if final_cds is not None:
            resp = self.respond(typeurls.CLUSTER, final_cds)
            if resp is not None:
                out.append(resp)
        return out

    def _respond_view(self, st: _TypeState, view: dict[str, Resource]) -> SotwResponse | None:
        version = view_version(view)
        if st.sent is not None and version == st.sent_version:
            return None
        return self._emit(st, view, version)

    # --- introspection ---------------------------------------------------------------------

    @property
    def subscribed_types(self) -> list[str]:
        return list(self._types)

    def subscription(self, type_url: str) -> tuple[bool, frozenset[str]]:
        st = self._types[type_url]
        return st.wildcard, frozenset(st.names)

    def status(self) -> list[TypeStatus]:
        return [
            TypeStatus(
                type_url=t,
                status=st.status(),
                sent_version=st.sent_version,
                sent_nonce=st.sent_nonce,
                acked_nonce=st.acked_nonce,
                last_nack=st.nack_message,
                resource_count=len(st.sent or ()),
            )
            for t, st in self._types.items()
        ]


def _others_change(stream: SotwStream, sets: Mapping[str, Mapping[str, Resource]]) -> bool:
    """Whether listeners or routes are part of this push (only then is a two-step cluster
    removal worth it; a pure cluster removal has nothing to move first)."""
    del stream
    return any(t in sets for t in (typeurls.LISTENER, typeurls.ROUTE))


def names_of(responses: Sequence[SotwResponse]) -> list[tuple[str, list[str]]]:
    """(type, names) per response; handy in tests and logs."""
    return [(r.type_url, [x.name for x in r.resources]) for r in responses]
