"""One ADS stream as the server holds it (`Connection`), and the stream-level rules around
it that need no server state: decoding requests, taking the node from the first request (wire
rule 1), framing responses and ending an RPC with a status.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest, DiscoveryRequest
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from control.ca.identity import Identity
from control.model.locality import join_locality
from control.model.proxy import NodeError, Proxy, proxy_from_node
from control.xds.delta import DeltaStream
from control.xds.sotw import SotwResponse, SotwStream
from control.xds.state import TypeStatus
from protos import wire

logger = logging.getLogger(__name__)

NO_TYPES: frozenset[str] = frozenset()


class StreamError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str, *, kind: str = "bad_request") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.kind = kind  # the class counted in pilotfish_xds_stream_errors


@dataclass(eq=False, slots=True)
class Connection:
    """One ADS stream and what the server tracks about it."""

    id: str
    proxy: Proxy
    delta: bool
    state: SotwStream | DeltaStream
    connected_at: float  # wall clock, for /debug/connections
    context: grpc.aio.ServicerContext | None = None
    # Who the caller authenticated as (None: an unauthenticated stream, the plaintext port).
    identity: Identity | None = None
    handler: asyncio.Task[Any] | None = None  # the RPC's task (reads requests)
    # Types that must be answered. Usually empty: then the shared NO_TYPES, where an empty
    # set (or a new empty frozenset: CPython does not share those) per stream would cost 216
    # bytes on thousands of idle streams.
    respond_types: frozenset[str] = NO_TYPES
    push_pending: bool = False
    push_types: frozenset[str] | None = None  # types the pending push covers; None = all
    # Start of the oldest push this stream has pending: a push coalesced into a later one
    # converges when the later one is ACKed, and its convergence time counts from its own
    # start, not the later one's.
    push_since: float = 0.0
    queued: bool = False  # waiting in the push queue
    busy: bool = False  # a write is in progress; whoever holds it sends what is pending
    closed: bool = False
    # Out of admission's window of new streams (control/xds/admission.py): in sync once, or
    # its window passed. Remembered so that later ACKs need not ask.
    settled: bool = False
    error: StreamError | None = None
    # type_url -> (nonce, push start) for convergence time of pushed responses.
    push_nonces: dict[str, tuple[str, float]] | None = None  # created on the first push

    def status(self) -> list[TypeStatus]:
        return self.state.status()

    @property
    def peer(self) -> str:
        """The client's address (asked of gRPC when needed, not stored on every stream)."""
        if self.context is None or self.closed:
            return ""
        try:
            return str(self.context.peer())
        except Exception:  # the RPC is already gone
            return ""


def timed_out(conn: Connection) -> bool:
    return conn.error is not None and conn.error.code is grpc.StatusCode.DEADLINE_EXCEEDED


async def end_stream(context: grpc.aio.ServicerContext, error: StreamError) -> None:
    """End the RPC with `error`'s status. After a send timeout the status waits behind the
    response the client is not reading (HTTP/2 sends trailers after DATA; grpc.aio has no way
    to reset a server stream), so a client that reads again gets the response and then this
    status, and re-dials. If the client goes away first, core fails the batch: that is the
    client cancelling, and is reported to gRPC as such (any other exception would be logged
    by grpc.aio as a servicer error)."""
    try:
        await context.abort(error.code, error.message)
    except grpc.aio.InternalError as e:
        logger.debug("stream status not delivered, the client went away: %s", e)
        raise asyncio.CancelledError from None


def decode_request(raw: bytes, delta: bool) -> DiscoveryRequest | DeltaDiscoveryRequest:
    try:
        return DeltaDiscoveryRequest.FromString(raw) if delta else DiscoveryRequest.FromString(raw)
    except DecodeError as e:
        raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {e}") from e


def proxy_of(first: DiscoveryRequest | DeltaDiscoveryRequest) -> Proxy:
    """Rule 1: the node comes from the first request; a stream without one is refused."""
    if not first.HasField("node") or not first.node.id:
        raise StreamError(
            grpc.StatusCode.INVALID_ARGUMENT, "the first request on a stream must carry node.id"
        )
    metadata: Mapping[str, Any] = json_format.MessageToDict(first.node.metadata)
    try:
        return proxy_from_node(first.node.id, metadata, node_locality(first.node.locality))
    except NodeError as e:
        raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from e


def node_locality(locality: Any) -> str:
    """An Envoy Node's locality as `region/zone/subzone`, without trailing empty parts."""
    return join_locality(locality.region, locality.zone, locality.sub_zone)


def encode_response(resp: Any, control_plane: bytes) -> bytes:
    """A response as it goes on the wire: the cached frame of a body that many streams share
    when the nonce is the body's own, else assembled around the cached resource bytes."""
    if type(resp) is SotwResponse:  # on every push to every stream: no subclass to allow
        body = resp.body
        if resp.nonce == body.nonce:
            return body.framed(resp.type_url, control_plane)
        return wire.discovery_response_block(
            body.version, body.block, resp.type_url, resp.nonce, control_plane
        )
    if resp.change is not None:
        framed: bytes = resp.change.framed(
            resp.type_url, resp.system_version_info, resp.nonce, control_plane
        )
        return framed
    if resp.selection is not None:
        shared: bytes = resp.selection.framed(
            resp.type_url, resp.system_version_info, resp.nonce, control_plane
        )
        return shared
    return wire.delta_discovery_response_block(
        resp.system_version_info,
        b"".join([r.delta_field() for r in resp.resources]),
        resp.type_url,
        list(resp.removed),
        resp.nonce,
        control_plane,
    )
