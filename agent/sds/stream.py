"""State-of-the-world SDS stream rules, sans-IO (the agent's mirror of the control plane's
SotW rules, for the one type SDS serves).

`SdsStream` takes DiscoveryRequests and the current secrets in and returns decisions out:
how a request was classified, which names were added or dropped (so the adapter can start or
stop watching file-mounted secrets), and the response to write, if any.

Rules: a request whose nonce is not the last one sent is stale and ignored; an ACK records
the acknowledged version; a NACK is recorded and the rejected secrets are not re-sent until
they change; a response is sent when the subscribed secrets changed, and newly subscribed
names are always answered. A name that cannot be served yet (the first certificate is still
being signed, a mounted file is missing) stays subscribed and is sent when it appears. An
empty response is never sent: Envoy rejects an SDS update without its secret.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest, DiscoveryResponse

from agent.sds.resources import SecretEntry, view_version
from protos import typeurls


class SdsProtocolError(ValueError):
    """A request SDS cannot serve (wrong type URL)."""


class RequestKind(enum.StrEnum):
    INITIAL = "initial"  # first request, or the client restarted the subscription (no nonce)
    ACK = "ack"
    NACK = "nack"
    STALE = "stale"  # nonce is not the last one sent: ignored


@dataclass(frozen=True, slots=True, eq=False)
class RequestOutcome:
    """What one SDS request asks of its stream."""

    kind: RequestKind
    # Answer now even if nothing changed (first request, newly subscribed names).
    must_respond: bool
    added: frozenset[str] = frozenset()
    removed: frozenset[str] = frozenset()
    error_message: str = ""


@dataclass(frozen=True, slots=True, eq=False)
class SdsResponse:
    """One SDS response: its version, nonce and secrets."""

    version_info: str
    nonce: str
    resources: tuple[SecretEntry, ...]

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.resources]

    def to_proto(self) -> DiscoveryResponse:
        return DiscoveryResponse(
            version_info=self.version_info,
            nonce=self.nonce,
            type_url=typeurls.SECRET,
            resources=[e.resource for e in self.resources],
        )


class SdsStream:
    """The rules of one StreamSecrets stream. Not thread-safe; drive it from one task."""

    def __init__(self) -> None:
        self.names: frozenset[str] = frozenset()
        self._started = False
        self._nonce = 0
        self.sent_version: str | None = None
        self.sent_nonce = ""
        self.acked_version = ""
        self.acked_nonce = ""
        self.nack_message = ""
        self.acks = 0
        self.nacks = 0

    def receive(self, req: DiscoveryRequest) -> RequestOutcome:
        if req.type_url and req.type_url != typeurls.SECRET:
            raise SdsProtocolError(f"SDS serves {typeurls.SECRET}, not {req.type_url!r}")
        names = frozenset(req.resource_names)
        nonce = req.response_nonce
        if self._started and nonce and nonce != self.sent_nonce:
            return RequestOutcome(RequestKind.STALE, must_respond=False)
        added, removed = names - self.names, self.names - names
        self.names = names
        if not self._started or not nonce:
            # A new subscription (or the client lost its state): answer whatever we believe
            # it has.
            self._started = True
            self.sent_version = None
            if req.HasField("error_detail"):
                # A NACK as the very first request (the client restarted mid-NACK): record it.
                self.nack_message = req.error_detail.message or f"code {req.error_detail.code}"
            return RequestOutcome(RequestKind.INITIAL, True, added, removed)
        if req.HasField("error_detail"):
            self.nacks += 1
            self.nack_message = req.error_detail.message or f"code {req.error_detail.code}"
            return RequestOutcome(
                RequestKind.NACK, bool(added), added, removed, error_message=self.nack_message
            )
        self.acks += 1
        self.acked_nonce = nonce
        self.acked_version = req.version_info
        self.nack_message = ""
        return RequestOutcome(RequestKind.ACK, bool(added), added, removed)

    def respond(
        self, secrets: Mapping[str, SecretEntry], *, force: bool = False
    ) -> SdsResponse | None:
        """The response for the subscribed names that exist, or None when there is nothing
        to send (nothing exists yet, or the client has exactly this already and `force` is
        off). A NACKed version is therefore never re-sent unforced."""
        view = tuple(secrets[n] for n in sorted(self.names) if n in secrets)
        if not view:
            return None
        version = view_version(view)
        if not force and version == self.sent_version:
            return None
        self._nonce += 1
        self.sent_version = version
        self.sent_nonce = str(self._nonce)
        return SdsResponse(version, self.sent_nonce, view)
