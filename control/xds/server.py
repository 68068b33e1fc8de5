"""The ADS server: a thin grpc.aio adapter around the sans-IO stream state machines.

Per stream there is one task, the RPC's handler, and it only reads: it decodes requests and
feeds them to the state machine at once (the request direction never waits for writes). A
bounded pool of send workers serves streams that need an answer or have a push pending: it asks
the generators for the resource sets of the subscribed types, lets the state machine decide
what to send, and writes the pre-assembled bytes (each resource was serialized once, in the
cache, and a response shared by many streams is framed once too; nothing is re-encoded).
Pushes are coalesced: a stream that is still writing when the next push arrives sends the
newest state once.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
from envoy.config.core.v3.base_pb2 import ControlPlane
from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest, DiscoveryRequest
from envoy.service.status.v3 import csds_pb2
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from control.ca.identity import Identity
from control.metrics import Metrics
from control.model.proxy import NodeError, Proxy, proxy_from_node
from control.xds.cache import Resource, ResourceSet, digest
from control.xds.delta import DeltaStream
from control.xds.push import TokenBucket
from control.xds.sotw import SotwResponse, SotwStream
from control.xds.state import RequestKind, RequestOutcome, TypeStatus
from protos import typeurls, wire
from protos.ads import raw_ads_handler

logger = logging.getLogger(__name__)


# Decides whether a stream may go on once its node is known: None to allow, or the status
# and message to end it with (the TLS port authenticates the caller and checks that the node
# claims the caller's own identity), or the caller's Identity to allow it as that caller.
_Refusal = tuple[grpc.StatusCode, str] | Identity | None
# May be async (Kubernetes mode asks the API server about tokens).
StreamAuthorizer = Callable[[grpc.aio.ServicerContext, Proxy], _Refusal | Awaitable[_Refusal]]
# The syncz entries a caller of syncz over xDS may see (None: an unauthenticated caller).
SynczFilter = Callable[[list[dict[str, Any]], Identity | None], list[dict[str, Any]]]


class ResourceSource(Protocol):
    """What the server needs from the rest of the control plane (the generators)."""

    def resources(self, proxy: Proxy, type_urls: Iterable[str]) -> dict[str, ResourceSet]:
        """Current resource sets of the given types for one proxy."""
        ...

    def push_started_at(self) -> float:
        """Monotonic time at which the current resources' push started."""
        ...


@dataclass(frozen=True, slots=True)
class XdsOptions:
    control_plane_id: str = "pilotfish"
    max_concurrent_pushes: int = 100
    connection_rate: float = 200.0  # new streams admitted per second ...
    connection_burst: float = 400.0  # ... after an initial burst of this many
    send_timeout: float = 30.0  # a stream that cannot take a response this long is closed
    # New streams gRPC holds until our handler takes them; beyond this many it refuses them
    # (see grpc_stream_options).
    max_pending_streams: int = 50_000
    # Most a connection's read buffer stays at after a burst of requests (see
    # grpc_stream_options).
    max_read_buffer: int = 16 << 10
    # Freed memory goes back to the system (the server's `trim`) `trim_idle` seconds after
    # the send queue drains, once this many streams were opened since the last time: after
    # a connection storm, not after pushes (see XdsServer._schedule_trim). 0: never.
    trim_after_streams: int = 500
    trim_idle: float = 1.0


def grpc_stream_options(options: XdsOptions) -> list[tuple[str, int]]:
    """gRPC server options for taking thousands of streams at once.

    The grpc.aio server takes incoming calls from gRPC core one per event-loop iteration, and
    core refuses calls that wait to be taken beyond a backlog (by default, at random from
    1,000 waiting and all from 3,000; the client sees CANCELLED). In a connection storm the
    loop is busy answering the streams it already has, the backlog passes 1,000 and proxies
    get errors instead of waiting their turn. Waiting calls cost a few hundred bytes in core;
    the expensive part of a new stream starts after our own admission (the token bucket,
    rule 9), which paces them. So the backlog is bounded only against a flood.

    Each connection's socket reads into buffers gRPC allocates ahead, sized by how much the
    last reads brought: a burst (a new Envoy's first requests, an EDS subscription naming a
    thousand clusters; a SotW EDS ACK names them all again) grows that size, it shrinks by 1%
    per read afterwards, and the unused part stays allocated between reads. Measured on 100
    streams per connection, that was 10-30 KB per stream kept for nothing once the storm was
    over (and with a connection per Envoy, as in a real mesh, it is per proxy). The clamp
    bounds what is allocated ahead: a larger request is read in more reads of this size
    (requests are small but for those bursts), and nothing changes on the wire."""
    return [
        ("grpc.max_concurrent_streams", 1 << 20),
        ("grpc.server.max_pending_requests", options.max_pending_streams),
        ("grpc.server.max_pending_requests_hard_limit", options.max_pending_streams),
        ("grpc.experimental.tcp_max_read_buffer_size", options.max_read_buffer),
    ]


_NO_TYPES: frozenset[str] = frozenset()


class _StreamError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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
    # Types that must be answered. Usually empty: then the shared _NO_TYPES, where an empty
    # set (or a new empty frozenset: CPython does not share those) per stream would cost 216
    # bytes on thousands of idle streams.
    respond_types: frozenset[str] = _NO_TYPES
    push_pending: bool = False
    push_types: frozenset[str] | None = None  # types the pending push covers; None = all
    # Start of the oldest push this stream has pending: a push coalesced into a later one
    # converges when the later one is ACKed, and its convergence time counts from its own
    # start, not the later one's.
    push_since: float = 0.0
    queued: bool = False  # waiting in the push queue
    busy: bool = False  # a write is in progress; whoever holds it sends what is pending
    closed: bool = False
    error: _StreamError | None = None
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


class XdsServer:
    """Serves SotW and delta ADS. Register it on a grpc.aio server with `add_to(server)`."""

    def __init__(
        self,
        source: ResourceSource,
        metrics: Metrics,
        options: XdsOptions = XdsOptions(),
        *,
        on_connect: Callable[[Proxy], None] | None = None,
        on_disconnect: Callable[[Proxy], None] | None = None,
        authorize: StreamAuthorizer | None = None,
        clock: Callable[[], float] = time.monotonic,
        trim: Callable[[], object] | None = None,
        syncz_filter: SynczFilter | None = None,
    ) -> None:
        self._source = source
        self._syncz_filter = syncz_filter
        self._authorize = authorize
        self._metrics = metrics
        self._options = options
        self._on_connect = on_connect
        self._on_disconnect = on_disconnect
        self._clock = clock
        self._ids = itertools.count(1)
        self._admission = TokenBucket(options.connection_rate, options.connection_burst)
        self._push_queue: collections.deque[Connection] = collections.deque()
        self._workers = 0
        self._worker_tasks: set[asyncio.Task[None]] = set()  # strong refs while they run
        self.connections: dict[str, Connection] = {}
        self._control_plane = ControlPlane(
            identifier=f'{{"Component":"pilotfish","ID":"{options.control_plane_id}"}}'
        ).SerializeToString()
        self.acks = 0  # total ACKs seen; tests and benchmarks wait on it
        self._by_type: dict[str, tuple[Any, Any, list[bytes | None]]] = {}
        # Writes in progress: when they started and the task doing them (see _watch_writes).
        self._writing: dict[Connection, tuple[float, asyncio.Task[Any]]] = {}
        self._watchdog: asyncio.Task[None] | None = None
        # Giving freed memory back after storms (see XdsOptions.trim_after_streams).
        self._trim = trim if options.trim_after_streams > 0 else None
        self._opened = 0  # streams opened since the last trim
        self._trim_timer: asyncio.TimerHandle | None = None
        self.trims = 0  # how many times it ran; tests wait on it

    # --- wiring ----------------------------------------------------------------------------

    def add_to(self, server: grpc.aio.Server) -> None:
        # Partials rather than methods that await _serve: one coroutine less held by every
        # open stream.
        server.add_generic_rpc_handlers(
            (
                raw_ads_handler(
                    functools.partial(self._serve, delta=False),
                    functools.partial(self._serve, delta=True),
                ),
            )
        )

    async def close(self) -> None:
        """Stop the background tasks (the send watchdog and any send worker still running);
        call after the gRPC server has stopped, when no stream is left to serve."""
        if self._trim_timer is not None:
            self._trim_timer.cancel()
            self._trim_timer = None
        tasks = [*self._worker_tasks, *([self._watchdog] if self._watchdog else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._watchdog = None

    @property
    def send_workers(self) -> int:
        """Send workers running now (at most `max_concurrent_pushes`)."""
        return self._workers

    def push_all(self, types: frozenset[str] | None = None) -> int:
        """Mark every stream for a push of the current resources of `types` (None: every
        subscribed type); returns how many streams. At most `max_concurrent_pushes` streams
        are generated for and written to at once (rule 9)."""
        started = self._source.push_started_at()
        for conn in self.connections.values():
            if conn.push_pending:
                # Coalesce with a push still waiting for its turn: the union of both.
                pending = conn.push_types
                conn.push_types = None if pending is None or types is None else pending | types
            else:
                conn.push_types = types
                conn.push_since = started
            conn.push_pending = True
            self._schedule(conn)
        return len(self.connections)

    def _schedule(self, conn: Connection) -> None:
        """Queue a stream for its send worker turn (once, however often it is asked)."""
        if not conn.queued:
            conn.queued = True
            self._push_queue.append(conn)
        if self._workers < self._options.max_concurrent_pushes and self._workers < len(
            self._push_queue
        ):
            self._workers += 1
            task = asyncio.get_running_loop().create_task(self._push_worker())
            self._worker_tasks.add(task)
            task.add_done_callback(self._worker_tasks.discard)

    # --- handlers --------------------------------------------------------------------------

    async def _serve(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext, *, delta: bool
    ) -> None:
        # context.read() rather than iterating `requests`: gRPC's request iterator keeps the
        # last message it yielded alive until the next one arrives, and an EDS ACK naming every
        # cluster is kilobytes that an idle stream would hold for nothing.
        first_raw = await context.read()
        if first_raw is grpc.aio.EOF:
            return
        try:
            first = _decode(first_raw, delta)
            proxy = _proxy_of(first)
        except _StreamError as e:
            await context.abort(e.code, e.message)
            return
        identity: Identity | None = None
        if self._authorize is not None:
            verdict = self._authorize(context, proxy)
            refused = await verdict if inspect.isawaitable(verdict) else verdict
            del verdict  # the finished coroutine would otherwise live as long as the stream
            if isinstance(refused, Identity):
                identity, refused = refused, None
            if refused is not None:
                logger.info("stream from %s (%s) refused: %s", context.peer(), proxy.id, refused[1])
                await context.abort(*refused)
                return
        wait = self._admission.take(self._clock())
        if wait > 0:
            self._metrics.rate_limited.inc()
            await asyncio.sleep(wait)
        conn_id = f"{proxy.id}-{next(self._ids)}"
        self._opened += 1
        state: SotwStream | DeltaStream = DeltaStream(conn_id) if delta else SotwStream(conn_id)
        conn = Connection(conn_id, proxy, delta, state, time.time(), identity=identity)
        self.connections[conn_id] = conn
        self._metrics.xds_clients.labels("delta" if delta else "sotw").inc()
        if self._on_connect is not None:
            self._on_connect(proxy)
        conn.context = context
        if logger.isEnabledFor(logging.INFO):
            logger.info(
                "stream %s opened (%s) from %s", conn_id, "delta" if delta else "sotw", conn.peer
            )
        conn.handler = asyncio.current_task()
        try:
            # Headers now, in a batch of their own: otherwise they ride with the first
            # response, and while that write is stuck on a client that does not read, gRPC
            # refuses to start the batch carrying the final status (it would hold headers a
            # second time: GRPC_CALL_ERROR_TOO_MANY_OPERATIONS). With them out, a status is
            # queued behind the stuck response, as HTTP/2 wants trailers after DATA.
            await context.send_initial_metadata(())
            # One task per stream, and it only reads: answers and pushes are generated and
            # written by the bounded pool of send workers, so reading requests never waits on
            # a slow client, and a connection storm encodes at most that many responses at
            # once (rule 9) instead of one per new stream.
            self._handle_request(conn, first)
            del first, first_raw  # the first request would otherwise live as long as the stream
            self._schedule(conn)
            while (raw := await context.read()) is not grpc.aio.EOF:
                self._handle_request(conn, _decode(raw, conn.delta))
                del raw  # do not hold the last request's bytes while waiting for the next
                if conn.respond_types:
                    self._schedule(conn)
        except _StreamError as e:
            conn.error = e
        except grpc.aio.AioRpcError as e:
            logger.debug("stream %s read ended: %s", conn.id, e.code())
        except asyncio.CancelledError:
            if not _timed_out(conn):
                raise
            # A send worker ended the stream (the client stopped reading): tell the client.
            handler = asyncio.current_task()
            assert handler is not None
            handler.uncancel()
        finally:
            conn.closed = True
            self.connections.pop(conn_id, None)
            self._metrics.xds_clients.labels("delta" if delta else "sotw").dec()
            if self._on_disconnect is not None:
                self._on_disconnect(proxy)
            logger.info("stream %s closed", conn_id)
        if conn.error is not None:
            if not _timed_out(conn):
                self._metrics.stream_errors.labels("bad_request").inc()
            await _end_stream(context, conn.error)

    def _handle_request(self, conn: Connection, req: Any) -> None:
        if not req.type_url:
            raise _StreamError(grpc.StatusCode.INVALID_ARGUMENT, "request without type_url")
        outcome: RequestOutcome = conn.state.receive(req)
        short = typeurls.SHORT_NAMES.get(req.type_url, req.type_url)
        if outcome.kind is RequestKind.ACK:
            self.acks += 1
            pushed = conn.push_nonces.get(req.type_url) if conn.push_nonces else None
            if pushed is not None and pushed[0] == req.response_nonce:
                self._metrics.convergence.observe(self._clock() - pushed[1])
                del conn.push_nonces[req.type_url]  # type: ignore[union-attr]
                if not conn.push_nonces:
                    conn.push_nonces = None  # an emptied dict keeps its table
        elif outcome.kind is RequestKind.NACK:
            self._metrics.rejects.labels(short).inc()
            logger.warning("%s NACKed %s: %s", conn.proxy.id, short, outcome.error_message)
        elif outcome.kind is RequestKind.STALE:
            self._metrics.stale_requests.labels(short).inc()
        if outcome.must_respond:
            conn.respond_types = conn.respond_types | {req.type_url}

    # --- sending ---------------------------------------------------------------------------

    async def _flush(self, conn: Connection) -> None:
        """Send whatever the stream has pending, unless another task is already writing to
        it (that task picks the new work up before it lets go). Writes to one stream are
        thereby serialized without a task or a lock per stream."""
        if conn.busy or conn.context is None or conn.closed:
            return
        conn.busy = True
        try:
            while (conn.respond_types or conn.push_pending) and not conn.closed:
                if not await self._send(conn, conn.context, self._collect(conn)):
                    if conn.handler is not None and conn.handler is not asyncio.current_task():
                        conn.handler.cancel()  # the handler is blocked reading: end the RPC
                    return
        except (grpc.aio.AioRpcError, grpc.aio.BaseError, asyncio.InvalidStateError) as e:
            # The client went away while we wrote (gRPC raises ExecuteBatchError, a BaseError,
            # for a write on an RPC it has already ended): its handler sees the end too.
            logger.debug("stream %s: write failed: %r", conn.id, e)
        finally:
            conn.busy = False

    async def _push_worker(self) -> None:
        try:
            while self._push_queue:
                conn = self._push_queue.popleft()
                conn.queued = False
                if conn.closed:
                    continue
                try:
                    await self._flush(conn)
                except Exception:
                    # A bug of ours (a generator failing for this proxy, say): logged, and
                    # the worker goes on with the other streams.
                    logger.exception("stream %s: sending failed", conn.id)
        finally:
            # Always given back: a slot lost here is a stream that is never served (a new
            # worker starts only while fewer run than streams wait).
            self._workers -= 1
            if self._workers == 0 and not self._push_queue:
                self._schedule_trim()

    def _schedule_trim(self) -> None:
        """The send queue drained: after a connection storm, give freed memory back a little
        later, unless sending has started again by then.

        Answering a new stream has gRPC copy each response (hundreds of kilobytes in a large
        mesh) while the stream's own long-lived state is allocated around those copies;
        glibc returns only the top of a heap, so what the copies leave between the streams'
        state stays in the process, resident, after the storm (1-4 KB per stream at 5,000
        proxies). After pushes to the streams already there it is not worth it: the next
        push's copies reuse that room, and trimming it would only have the pages faulted in
        again (and hold glibc's arena locks while gRPC threads wait)."""
        if (
            self._trim is None
            or self._opened < self._options.trim_after_streams
            or self._trim_timer is not None
        ):
            return
        loop = asyncio.get_running_loop()
        self._trim_timer = loop.call_later(self._options.trim_idle, self._trim_if_idle)

    def _trim_if_idle(self) -> None:
        self._trim_timer = None
        if self._workers or self._push_queue or self._trim is None:
            return  # busy again: the next drain schedules it
        self._opened = 0
        task = asyncio.get_running_loop().create_task(self._run_trim(self._trim))
        self._worker_tasks.add(task)
        task.add_done_callback(self._worker_tasks.discard)

    async def _run_trim(self, trim: Callable[[], object]) -> None:
        await asyncio.to_thread(trim)  # it walks every heap: not on the event loop
        self.trims += 1

    async def _send(
        self,
        conn: Connection,
        context: grpc.aio.ServicerContext,
        frames: list[tuple[str, bytes]],
    ) -> bool:
        """Write frames in order; False when the stream must close. A separate coroutine so
        that the encoded bytes are released as soon as they are written, not kept by an idle
        stream until its next push.

        A write that the client does not take within `send_timeout` is cancelled by the
        watchdog (one timer for the whole server instead of one per write: this is the hot
        path of a push)."""
        task = asyncio.current_task()
        assert task is not None
        for type_url, data in frames:
            self._writing[conn] = (self._clock(), task)
            self._start_watchdog()
            try:
                await context.write(data)
            except asyncio.CancelledError:
                if not _timed_out(conn):
                    raise
                task.uncancel()  # our watchdog's cancellation, not the worker's
                self._metrics.push_errors.labels(_short(type_url)).inc()
                logger.warning("stream %s: send timed out; closing it", conn.id)
                return False
            finally:
                self._writing.pop(conn, None)
            pushes, sizes, last = self._type_metrics(type_url)
            pushes.inc()
            if data is not last[0]:
                # Streams share the bytes of identical responses: the size is observed once
                # per distinct response, not once per stream.
                last[0] = data
                sizes.observe(len(data))
        return True

    def _start_watchdog(self) -> None:
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.get_running_loop().create_task(self._watch_writes())

    async def _watch_writes(self) -> None:
        """Cancel writes that have waited longer than `send_timeout` on a client that does
        not read; exits when nothing is being written."""
        timeout = self._options.send_timeout
        while self._writing:
            await asyncio.sleep(min(1.0, timeout / 4))
            now = self._clock()
            for conn, (started, task) in list(self._writing.items()):
                if now - started > timeout and conn.error is None:
                    conn.error = _StreamError(
                        grpc.StatusCode.DEADLINE_EXCEEDED, "client did not read responses"
                    )
                    task.cancel()

    def _type_metrics(self, type_url: str) -> tuple[Any, Any, list[bytes | None]]:
        """The per-type metric children, looked up once (labels() is slow on a hot path),
        and the last response observed for the size histogram."""
        found = self._by_type.get(type_url)
        if found is None:
            short = _short(type_url)
            found = (
                self._metrics.pushes.labels(short),
                self._metrics.config_size.labels(short),
                [None],
            )
            self._by_type[type_url] = found
        return found

    def _collect(self, conn: Connection) -> list[tuple[str, bytes]]:
        """Decide what to send now; returns encoded responses in order."""
        forced = conn.respond_types
        conn.respond_types = _NO_TYPES
        push = conn.push_pending
        push_types = conn.push_types
        conn.push_pending = False
        conn.push_types = None
        state = conn.state
        pushed: set[str] = set()
        if push:
            pushed = {t for t in state.subscribed_types if t != typeurls.DEBUG_SYNCZ}
            if push_types is not None:
                pushed &= push_types
        wanted = pushed | {t for t in forced if t != typeurls.DEBUG_SYNCZ}
        sets: dict[str, ResourceSet] = self._source.resources(conn.proxy, wanted) if wanted else {}
        if typeurls.DEBUG_SYNCZ in forced:
            sets[typeurls.DEBUG_SYNCZ] = self.syncz_resources(conn.identity)
        frames: list[tuple[str, bytes]] = []
        answered: set[str] = set()
        if push:
            for resp in state.push({t: sets[t] for t in pushed}):
                frames.append((resp.type_url, self._encode(resp)))
                if conn.push_nonces is None:
                    conn.push_nonces = {}
                # From the oldest push this response carries (see Connection.push_since).
                conn.push_nonces[resp.type_url] = (resp.nonce, conn.push_since)
                answered.add(resp.type_url)
        for type_url in sorted(forced - answered):
            answer = state.respond(type_url, sets.get(type_url, ResourceSet(())), force=True)
            if answer is not None:
                frames.append((type_url, self._encode(answer)))
        return frames

    def _encode(self, resp: Any) -> bytes:
        if isinstance(resp, SotwResponse):
            body = resp.body
            if resp.nonce == body.nonce:
                return body.framed(resp.type_url, self._control_plane)
            return wire.discovery_response_block(
                body.version, body.block, resp.type_url, resp.nonce, self._control_plane
            )
        if resp.selection is not None:
            shared: bytes = resp.selection.framed(
                resp.type_url, resp.system_version_info, resp.nonce, self._control_plane
            )
            return shared
        return wire.delta_discovery_response_block(
            resp.system_version_info,
            b"".join([r.delta_field() for r in resp.resources]),
            resp.type_url,
            list(resp.removed),
            resp.nonce,
            self._control_plane,
        )

    # --- debug -----------------------------------------------------------------------------

    def syncz(self) -> list[dict[str, Any]]:
        """One entry per connected stream (for /debug/syncz)."""
        out = []
        for conn in sorted(self.connections.values(), key=lambda c: c.id):
            out.append(
                {
                    "proxy": conn.proxy.id,
                    "namespace": conn.proxy.namespace,
                    "stream": conn.id,
                    "istiod": self._options.control_plane_id,
                    "protocol": "delta" if conn.delta else "sotw",
                    "types": {
                        s.type_url: {
                            "status": s.status.value,
                            "sent_version": s.sent_version,
                            "sent_nonce": s.sent_nonce,
                            "acked_nonce": s.acked_nonce,
                            "last_nack": s.last_nack,
                            "resources": s.resource_count,
                        }
                        for s in conn.status()
                        if s.type_url != typeurls.DEBUG_SYNCZ
                    },
                }
            )
        return out

    def syncz_resources(self, caller: Identity | None = None) -> ResourceSet:
        """syncz as xDS resources (envoy.service.status.v3.ClientConfig, as Istio serves it),
        the entries `caller` may see (`syncz_filter`, control/debugaccess.py)."""
        type_url = "type.googleapis.com/envoy.service.status.v3.ClientConfig"
        out: list[Resource] = []
        entries = self.syncz()
        if self._syncz_filter is not None:
            entries = self._syncz_filter(entries, caller)
        for entry in entries:
            cc = csds_pb2.ClientConfig()
            cc.node.id = entry["proxy"]
            cc.node.metadata.update(
                {"CONTROL_PLANE_ID": entry["istiod"], "STREAM": entry["stream"]}
            )
            for t, row in entry["types"].items():
                g = cc.generic_xds_configs.add()
                g.type_url = t
                g.version_info = row["sent_version"]
                g.config_status = csds_pb2.ConfigStatus.Value(row["status"])
                if row["last_nack"]:
                    g.error_state.details = row["last_nack"]
            value = cc.SerializeToString(deterministic=True)
            out.append(
                Resource(entry["stream"], digest(value), type_url, wire.any_bytes(type_url, value))
            )
        return ResourceSet(out)

    def connections_view(self) -> list[dict[str, Any]]:
        return [
            {
                "id": c.id,
                "proxy": c.proxy.id,
                "ip": c.proxy.ip,
                "namespace": c.proxy.namespace,
                "peer": c.peer,
                "protocol": "delta" if c.delta else "sotw",
                "connected_at": c.connected_at,
                "subscribed": sorted(c.state.subscribed_types),
            }
            for c in sorted(self.connections.values(), key=lambda c: c.id)
        ]


def _timed_out(conn: Connection) -> bool:
    return conn.error is not None and conn.error.code is grpc.StatusCode.DEADLINE_EXCEEDED


async def _end_stream(context: grpc.aio.ServicerContext, error: _StreamError) -> None:
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


def _short(type_url: str) -> str:
    return typeurls.SHORT_NAMES.get(type_url, type_url)


def _decode(raw: bytes, delta: bool) -> DiscoveryRequest | DeltaDiscoveryRequest:
    try:
        return DeltaDiscoveryRequest.FromString(raw) if delta else DiscoveryRequest.FromString(raw)
    except DecodeError as e:
        raise _StreamError(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {e}") from e


def _proxy_of(first: DiscoveryRequest | DeltaDiscoveryRequest) -> Proxy:
    """Rule 1: the node comes from the first request; a stream without one is refused."""
    if not first.HasField("node") or not first.node.id:
        raise _StreamError(
            grpc.StatusCode.INVALID_ARGUMENT, "the first request on a stream must carry node.id"
        )
    metadata: Mapping[str, Any] = json_format.MessageToDict(first.node.metadata)
    try:
        return proxy_from_node(first.node.id, metadata)
    except NodeError as e:
        raise _StreamError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from e
