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

import functools
import sys
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass

from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest
from google.protobuf.message import DecodeError

from control.xds.cache import Resource, ResourceSet, View, view_version
from control.xds.state import (
    WILDCARD,
    RequestKind,
    RequestOutcome,
    StreamRules,
    SyncStatus,
    nack_stands,
    ordered,
    shared_outcome,
    sync_status,
)
from control.xds.viewdiff import changed_part, updated_names
from protos import typeurls, wire


class SotwResponse:
    """One response: `view` is what the client holds once it applies it; `part`, when set, is
    the subset of `view` the response carries (an endpoint push that sends only the
    assignments that changed, see SotwStream.push). Not changed once made.

    A plain class rather than a frozen dataclass: one is made for every stream on every
    push, and a frozen dataclass's constructor sets each field through object.__setattr__,
    twice the cost of the rest of the decision for an endpoint push."""

    __slots__ = ("nonce", "part", "type_url", "view")

    def __init__(self, type_url: str, nonce: str, view: View, part: View | None = None) -> None:
        self.type_url = type_url
        self.nonce = nonce
        self.view = view
        self.part = part

    def __repr__(self) -> str:
        return f"SotwResponse({self.type_url!r}, {self.nonce!r}, {self.view.version!r})"

    @property
    def body(self) -> View:
        """The resources on the wire (with the version of the whole view)."""
        return self.part if self.part is not None else self.view

    @property
    def version_info(self) -> str:
        return self.view.version

    @property
    def resources(self) -> tuple[Resource, ...]:
        return self.body.resources


@dataclass(slots=True)
class _TypeState:
    type_url: str
    # A frozenset: its hash is computed once and keys the shared views of a ResourceSet.
    names: frozenset[str] = frozenset()
    raw_names: tuple[str, ...] = ()  # as last requested, to spot an unchanged list cheaply
    # raw_names as the client serialized them (shared, see _shared_names), when its last
    # request laid them out so: the next request is then matched on its bytes (an ACK of
    # EDS names every cluster, and making a string of each cost more than the rest of the
    # ACK). None: compared the slow way.
    names_wire: bytes | None = None
    legacy_wildcard: bool = False
    # What the last response held: the whole view, and the part of it that went on the
    # wire when only changed assignments were sent (None: all of it).
    sent: View | None = None
    sent_part: View | None = None
    sent_nonce: str = ""
    acked_nonce: str = ""
    nack_message: str = ""
    nacked_nonce: str = ""
    max_view_seq: int = 0  # newest shared view sent for this type (see SotwStream._emit)

    @property
    def wildcard(self) -> bool:
        return WILDCARD in self.names or (self.legacy_wildcard and not self.names)

    @property
    def sent_version(self) -> str:
        return self.sent.version if self.sent is not None else ""

    def view(self, resources: Mapping[str, Resource]) -> View:
        """The part of `resources` this subscription covers."""
        if not isinstance(resources, ResourceSet):
            resources = ResourceSet(resources)
        return resources.view(None if self.wildcard else self.names)

    def resource_count(self) -> int:
        return len(self.sent) if self.sent is not None else 0

    def status(self) -> SyncStatus:
        return sync_status(self, self.sent is not None, self.acked_nonce == self.sent_nonce)


# The ACK of a response, as `decode_unchanged` compares it: by (version, type, nonce), which
# every stream sent the same shared view has alike, so a push's thousand ACKs need it once.
_ack_bytes = functools.lru_cache(maxsize=1024)(wire.request_ack)


@functools.lru_cache(maxsize=4096)
def _shared_names(raw: tuple[str, ...]) -> tuple[tuple[str, ...], frozenset[str], bytes]:
    """One copy of each distinct subscription, shared by every stream that sends it: a
    thousand Envoys asking for the same hundred clusters hold one tuple, one frozenset and
    one encoding (wire.request_names) instead of a thousand copies of the names."""
    return raw, frozenset(raw), wire.request_names(raw)


class SotwStream(StreamRules[_TypeState]):
    """The rules of one SotW ADS stream. Not thread-safe; drive it from one task."""

    __slots__ = ()

    # --- requests --------------------------------------------------------------------------

    def decode_unchanged(
        self, raw: bytes, whole: Container[str] = ()
    ) -> DiscoveryRequest | tuple[str, str] | None:
        """The request `raw` decoded without its resource names, when its bytes show that
        they are the names the last request of its type named; then pass it on as
        `receive(req, raw, same_names=True)`. None: decode it whole (the names changed, or
        cannot be told from the bytes). Decoding makes a string of every name, and an EDS
        ACK names every cluster the proxy uses: for an unchanged list that was most of the
        cost of the ACK, and a push brings one ACK per stream.

        A (type URL, nonce) pair: `raw` is, byte for byte, the ACK of the last response of
        that type with the same names and nothing else (no node, no error); it is recorded
        already, as `receive` records an ACK (its outcome: an ACK that needs no answer). A
        push's ACKs are such, and their bytes are then never decoded. Types in `whole` are
        never taken from the bytes this way (their requests are decoded)."""
        at = -2  # not looked for yet: only a stream with a named subscription needs it
        for st in self._types.values():
            names = st.names_wire
            if not names:  # no names (a wildcard), or not comparable on the bytes
                continue
            sent = st.sent
            if (
                sent is not None
                and st.type_url not in whole
                and wire.is_ack(raw, _ack_bytes(sent.version, st.type_url, st.sent_nonce), names)
            ):
                self.requests += 1
                self._ack(st)
                return st.type_url, st.sent_nonce
            if at == -2:
                at = wire.first_request_name(raw)
            rest = wire.without_request_names(raw, at, names)
            if rest is None:
                continue
            try:
                req = DiscoveryRequest.FromString(rest)
            except DecodeError:
                return None  # decoded whole, the error is reported as for any request
            # Another type's names (two types subscribed to the same list): decoded whole.
            return req if req.type_url == st.type_url else None
        return None

    def receive(
        self, req: DiscoveryRequest, raw: bytes | None = None, *, same_names: bool = False
    ) -> RequestOutcome:
        """Classify a request and update the subscription it carries. `raw`: the request as
        it came (optional), to tell an unchanged list of names from its bytes. `same_names`:
        `req` came from `decode_unchanged`, without its names, which are the type's last."""
        self.requests += 1
        type_url = sys.intern(req.type_url)  # one copy per type, not one per stream
        st = self._types.get(type_url)
        nonce = req.response_nonce
        names_wire = st.names_wire if st is not None else None
        if same_names and not names_wire:
            # Its names are not in `req`: reading them as empty would unsubscribe them all.
            raise ValueError(f"{type_url}: same_names without names seen on the bytes")
        if st is not None and (
            same_names
            or (
                names_wire is not None
                and raw is not None
                and wire.request_names_match(raw, names_wire)
            )
        ):
            # Unchanged (the common ACK), seen on the bytes: keep the shared state.
            raw_names, names = st.raw_names, st.names
        else:
            raw_names = tuple(req.resource_names)
            if st is not None and raw_names == st.raw_names:
                # Unchanged: keep the shared tuple, frozenset and its hash.
                raw_names, names = st.raw_names, st.names
                encoded = _shared_names(raw_names)[2] if names_wire is None else names_wire
            else:
                raw_names, names, encoded = _shared_names(raw_names)
            names_wire = None
            if raw is not None and wire.request_names_match(raw, encoded):
                names_wire = encoded
        if st is None:
            st = _TypeState(
                type_url,
                names=names,
                raw_names=raw_names,
                names_wire=names_wire,
                legacy_wildcard=not names,
            )
            self._types[type_url] = st
            if req.error_detail.message or req.error_detail.code:
                # A NACK as the very first request (the client restarted mid-NACK): record it.
                st.nack_message = req.error_detail.message
            return shared_outcome(type_url, RequestKind.INITIAL, True)

        if nonce and nonce != st.sent_nonce:
            return shared_outcome(type_url, RequestKind.STALE, False)
        if not nonce:
            # The client (re)starts this subscription, e.g. after it lost the stream's state:
            # answer with what it asks for whatever we believe it has.
            st.names, st.raw_names, st.names_wire = names, raw_names, names_wire
            # Legacy wildcard holds only while the client has never named a resource (xDS
            # spec); a later empty list unsubscribes from everything.
            st.legacy_wildcard = st.legacy_wildcard and not names
            st.sent = None
            return shared_outcome(type_url, RequestKind.INITIAL, True)

        added = names - st.names
        st.names, st.raw_names, st.names_wire = names, raw_names, names_wire
        if names:
            st.legacy_wildcard = False
        if req.HasField("error_detail"):
            self.nacks += 1
            st.nack_message = req.error_detail.message or f"code {req.error_detail.code}"
            st.nacked_nonce = st.sent_nonce
            return RequestOutcome(
                type_url,
                RequestKind.NACK,
                must_respond=bool(added),
                error_message=st.nack_message,
            )
        self._ack(st)
        # Shared, not built per ACK: a push to a thousand streams brings a thousand of them.
        return shared_outcome(type_url, RequestKind.ACK, bool(added))

    def _ack(self, st: _TypeState) -> None:
        """The client ACKed the last response of `st`'s type (the request's nonce is
        `st.sent_nonce`)."""
        self.acks += 1
        st.acked_nonce = st.sent_nonce  # equal to the request's, and shared (see _emit)
        st.nack_message = ""
        st.nacked_nonce = ""

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
        if not force and st.sent is not None and view.version == st.sent.version:
            return None
        return self._emit(st, view)

    def _emit(self, st: _TypeState, view: View, part: View | None = None) -> SotwResponse:
        # The nonce of the view on the wire lets every stream share one encoded response.
        # Views are numbered in creation order, so a view newer than any this type has sent
        # cannot have been sent before; an older one (sent again, or back to an earlier
        # selection) gets a nonce and an encoding of its own, and nonces stay unique on the
        # stream.
        body = part if part is not None else view
        if body.seq > st.max_view_seq:
            st.max_view_seq = body.seq
            nonce = body.nonce
        else:
            nonce = f"{body.nonce}.{self._nonces.next()}"
        st.sent = view
        st.sent_part = part
        st.sent_nonce = nonce
        return SotwResponse(st.type_url, nonce, view, part)

    def _respond_changed(
        self, st: _TypeState, resources: Mapping[str, Resource]
    ) -> SotwResponse | None:
        """An endpoint push: only the assignments that changed since the last response.

        SotW requires the complete set for listeners and clusters only; Envoy hands each
        EDS cluster the assignments a response names and leaves the others alone, and gRPC's
        xDS client deletes missing resources only for LDS and CDS (istiod sends these partial
        EDS pushes too, envoyproxy/envoy#13009). With a thousand clusters, a moved endpoint
        is then one assignment on the wire per proxy instead of a thousand. The whole set is
        sent when the client stands NACKing (it may not hold what we last sent), when an
        assignment disappeared (only the complete set says so) or when everything changed."""
        view = st.view(resources)
        sent = st.sent
        if sent is not None and view.version == sent.version:
            return None
        if sent is None:
            return self._emit(st, view)
        if nack_stands(st):
            # Rule 4: a whole set holding just what the rejected part held (the client has
            # since unsubscribed from the rest) would be rejected again unchanged.
            rejected = st.sent_part
            if rejected is not None and view_version(rejected.by_name) == view.version:
                return None
            return self._emit(st, view)
        return self._emit(st, view, changed_part(sent, view))

    def push(self, sets: Mapping[str, Mapping[str, Resource]]) -> list[SotwResponse]:
        """Responses for a push of new resource sets, in make-before-break order.

        When clusters disappear, the first CDS response keeps them (with the bytes the client
        already has) so listeners and routes can move off them first; a final CDS response
        then drops them.
        """
        if len(sets) == 1 and typeurls.ENDPOINT in sets:
            # An endpoint push, the common case: no order to keep, no cluster updated.
            st = self._types.get(typeurls.ENDPOINT)
            resp = None if st is None else self._respond_changed(st, sets[typeurls.ENDPOINT])
            return [] if resp is None else [resp]
        out: list[SotwResponse] = []
        final_cds: Mapping[str, Resource] | None = None
        refresh_eds = self._updates_eds_clusters(sets)
        for type_url in ordered(sets):
            st = self._types.get(type_url)
            if st is None:
                continue
            resources = sets[type_url]
            if type_url == typeurls.ENDPOINT:
                if refresh_eds:
                    resp = self.respond(type_url, resources, force=True)
                else:
                    resp = self._respond_changed(st, resources)
                if resp is not None:
                    out.append(resp)
                continue
            if type_url == typeurls.CLUSTER and st.sent is not None:
                view = st.view(resources)
                if view.version == st.sent.version:
                    continue  # unchanged: nothing to send, nothing removed
                removed = {n: r for n, r in st.sent.by_name.items() if n not in view.by_name}
                # Two steps only when listeners or routes move in this push: a pure cluster
                # removal has nothing to move off the removed clusters first.
                if removed and (typeurls.LISTENER in sets or typeurls.ROUTE in sets):
                    transitional = View({**removed, **view.by_name})
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

    def _updates_eds_clusters(self, sets: Mapping[str, Mapping[str, Resource]]) -> bool:
        """Whether this push changes a cluster the client already has and whose assignment it
        subscribes to. Envoy warms an updated EDS cluster until an assignment for it arrives
        (or its initial fetch timeout, 15 s, passes), so the assignment must be sent again
        even when it did not change itself, as Istio's full pushes do. Never while the client
        stands NACKing its assignments: rule 2 forbids re-sending what it rejected unchanged."""
        if typeurls.CLUSTER not in sets:  # an EDS-only push: the common case, decided first
            return False
        cds, eds = self._types.get(typeurls.CLUSTER), self._types.get(typeurls.ENDPOINT)
        if cds is None or eds is None or cds.sent is None:
            return False
        if eds.status() is SyncStatus.ERROR:
            return False
        new = cds.view(sets[typeurls.CLUSTER])
        if new.version == cds.sent.version:
            return False
        updated = updated_names(cds.sent, new)
        return bool(updated) and (eds.wildcard or not updated.isdisjoint(eds.names))

    def _respond_view(self, st: _TypeState, view: View) -> SotwResponse | None:
        if st.sent is not None and view.version == st.sent.version:
            return None
        return self._emit(st, view)

    # --- introspection ---------------------------------------------------------------------

    def subscription(self, type_url: str) -> tuple[bool, frozenset[str]]:
        st = self._types[type_url]
        return st.wildcard, frozenset(st.names)


def names_of(responses: Sequence[SotwResponse]) -> list[tuple[str, list[str]]]:
    """(type, names) per response; handy in tests and logs."""
    return [(r.type_url, [x.name for x in r.resources]) for r in responses]
