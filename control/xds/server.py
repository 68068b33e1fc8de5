"""The ADS server: a thin grpc.aio adapter around the sans-IO stream state machines.

Per stream there is one task, the RPC's handler, and it only reads: it decodes requests and
feeds them to the state machine at once (the request direction never waits for writes). A
bounded pool of send workers serves streams that need an answer or have a push pending: it asks
the generators for the resource sets of the subscribed types, lets the state machine decide
what to send, and writes the pre-assembled bytes (each resource was serialized once, in the
cache, and a response shared by many streams is framed once too; nothing is re-encoded).
Pushes are coalesced: a stream that is still writing when the next push arrives sends the
newest state once.

Over 450 lines on purpose: the stream handler, the send workers, the write watchdog and the
reject bookkeeping all act on one `Connection` and one set of metrics under the same
ordering rules (a stream's writes are one worker's at a time); split apart, each part would
reach into the others' state. The rules themselves are elsewhere, sans-IO (sotw.py, delta.py,
admission.py, state.py).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import grpc
from envoy.config.core.v3.base_pb2 import ControlPlane

from control.ca.identity import Identity
from control.metrics import Metrics, grpc_code_name, metric_type
from control.xds.admission import AdmissionGate
from control.xds.cache import ResourceSet
from control.xds.connection import (
    NO_TYPES,
    Connection,
    StreamError,
    decode_request,
    encode_response,
    end_stream,
    proxy_of,
    timed_out,
)
from control.xds.delta import DeltaStream

# Re-exported: the hooks were defined here, and callers import them from here.
from control.xds.hooks import HealthHook, health_error
from control.xds.hooks import ResourceSource as ResourceSource
from control.xds.hooks import StreamAuthorizer as StreamAuthorizer
from control.xds.hooks import StreamHook as StreamHook
from control.xds.hooks import StreamRefused as StreamRefused
from control.xds.hooks import SubscriptionGuard as SubscriptionGuard

# Re-exported: the server's options were defined here, and callers import them from here.
from control.xds.options import XdsOptions as XdsOptions
from control.xds.options import grpc_stream_options as grpc_stream_options
from control.xds.sotw import SotwStream
from control.xds.state import RequestKind, RequestOutcome
from control.xds.trim import HeapTrimmer
from control.xds.views import SynczFilter, syncz_resources
from control.xds.written import WrittenResponses
from protos import typeurls
from protos.ads import raw_ads_handler

logger = logging.getLogger(__name__)


class XdsServer:
    """Serves SotW and delta ADS. Register it on a grpc.aio server with `add_to(server)`."""

    def __init__(
        self,
        source: ResourceSource,
        metrics: Metrics,
        options: XdsOptions = XdsOptions(),
        *,
        on_connect: StreamHook | None = None,
        on_disconnect: StreamHook | None = None,
        on_health: HealthHook | None = None,
        authorize: StreamAuthorizer | None = None,
        clock: Callable[[], float] = time.monotonic,
        trim: Callable[[], object] | None = None,
        syncz_filter: SynczFilter | None = None,
        guards: Mapping[str, SubscriptionGuard] | None = None,
    ) -> None:
        self._source = source
        self._guards = dict(guards or {})
        self._syncz_filter = syncz_filter
        self._authorize = authorize
        self._metrics = metrics
        self._options = options
        self._on_connect = on_connect
        self._on_disconnect = on_disconnect
        self._on_health = on_health
        self._clock = clock
        self._ids = itertools.count(1)
        self._push_queue: collections.deque[Connection] = collections.deque()
        # Paced by how many streams wait for a send worker (see control/xds/admission.py).
        self._admission = AdmissionGate(
            options.admission,
            queued=self._push_queue.__len__,
            on_wait=metrics.rate_limited.inc,
            on_slowdown=lambda reason: metrics.admission_slowdowns.labels(reason).inc(),
            clock=clock,
        )
        metrics.admission_rate.set_function(lambda: self._admission.rate)
        self._workers = 0
        self._worker_tasks: set[asyncio.Task[None]] = set()  # strong refs while they run
        self.connections: dict[str, Connection] = {}
        self._control_plane = ControlPlane(
            identifier=f'{{"Component":"pilotfish","ID":"{options.control_plane_id}"}}'
        ).SerializeToString()
        self.acks = 0  # total ACKs seen; tests and benchmarks wait on it
        self.acks_on_bytes = 0  # those of them recognised without decoding (a push's ACKs)
        # Observed for every stream on every push (an attribute less to look up each time).
        self._convergence = metrics.convergence
        self._queue_time = metrics.queue_time
        self._written = WrittenResponses(metrics)
        # proxy id -> the (type, err) series of the per-type reject gauges it has, removed
        # when its last stream closes so that churning proxies do not grow them.
        self._rejected: dict[str, set[tuple[str, str]]] = {}
        self._versions: set[str] = set()
        # Writes in progress: when they started and the task doing them (see _watch_writes).
        self._writing: dict[Connection, tuple[float, asyncio.Task[Any]]] = {}
        self._watchdog: asyncio.Task[None] | None = None
        # Giving freed memory back after storms (see XdsOptions.trim_after_streams).
        self._trimmer = HeapTrimmer(
            trim,
            lambda: bool(self._workers or self._push_queue),
            after_streams=options.trim_after_streams,
            idle=options.trim_idle,
        )

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
        await self._trimmer.close()
        await self._admission.close()
        tasks = [*self._worker_tasks, *([self._watchdog] if self._watchdog else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._watchdog = None

    @property
    def trims(self) -> int:
        """How many times freed memory was given back (see control/xds/trim.py)."""
        return self._trimmer.trims

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
        # Workers blocked in a write (a client that does not read) cannot take the queue:
        # counting them as available left a new stream unanswered until a stuck write timed
        # out, whenever nothing else (a push to every stream) happened to queue more work.
        available = self._workers - len(self._writing)
        if self._workers < self._options.max_concurrent_pushes and available < len(
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
            first = decode_request(first_raw, delta)
            proxy = proxy_of(first)
        except StreamError as e:
            await context.abort(e.code, e.message)
            return
        identity: Identity | None = None
        if self._authorize is not None:
            try:
                verdict = self._authorize(context, proxy)
                identity = await verdict if inspect.isawaitable(verdict) else verdict
                del verdict  # the finished coroutine would otherwise live as long as the stream
            except StreamRefused as refused:
                logger.info(
                    "stream from %s (%s) refused: %s", context.peer(), proxy.id, refused.message
                )
                await context.abort(refused.code, refused.message)
                return
        conn_id = f"{proxy.id}-{next(self._ids)}"
        await self._admission.admit(conn_id)
        self._trimmer.stream_opened()
        state: SotwStream | DeltaStream = DeltaStream(conn_id) if delta else SotwStream(conn_id)
        conn = Connection(conn_id, proxy, delta, state, time.time(), identity=identity)
        self.connections[conn_id] = conn
        version = self._version_label(proxy.istio_version)
        self._metrics.xds_clients.labels(version).inc()
        if self._on_connect is not None:
            self._on_connect(proxy, identity)
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
            self._handle_request(conn, first, first_raw)
            del first, first_raw  # the first request would otherwise live as long as the stream
            self._schedule(conn)
            while (raw := await context.read()) is not grpc.aio.EOF:
                self._read(conn, raw)
                del raw  # do not hold the last request's bytes while waiting for the next
                if conn.respond_types:
                    self._schedule(conn)
        except StreamError as e:
            conn.error = e
        except grpc.aio.AioRpcError as e:
            logger.debug("stream %s read ended: %s", conn.id, e.code())
        except asyncio.CancelledError:
            if not timed_out(conn):
                raise
            # A send worker ended the stream (the client stopped reading): tell the client.
            handler = asyncio.current_task()
            assert handler is not None
            handler.uncancel()
        finally:
            conn.closed = True
            self._admission.settled(conn_id)
            self.connections.pop(conn_id, None)
            self._metrics.xds_clients.labels(version).dec()
            self._forget_rejects(proxy.id)
            if self._on_disconnect is not None:
                self._on_disconnect(proxy, identity)
            logger.info("stream %s closed", conn_id)
        if conn.error is not None:
            if not timed_out(conn):
                self._metrics.stream_errors.labels(conn.error.kind).inc()
            await end_stream(context, conn.error)

    def _read(self, conn: Connection, raw: bytes) -> None:
        """Decode and handle a request that follows the stream's first."""
        state = conn.state
        if type(state) is SotwStream:  # on every ACK: the exact type, no subclass to allow
            # Most requests after the first are ACKs naming what the one before named:
            # decoded without the names (SotwStream.decode_unchanged). A guarded type is
            # decoded whole: its guard judges the names themselves.
            slim = state.decode_unchanged(raw, self._guards)
            if isinstance(slim, tuple):  # a push's ACK, seen (and recorded) on its bytes
                self.acks_on_bytes += 1
                self._acked(conn, *slim)
                return
            if slim is not None and slim.type_url not in self._guards:
                self._handle_request(conn, slim, raw, same_names=True)
                return
        self._handle_request(conn, decode_request(raw, conn.delta), raw)

    def _handle_request(
        self, conn: Connection, req: Any, raw: bytes | None = None, same_names: bool = False
    ) -> None:
        if not req.type_url:
            raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, "request without type_url")
        if req.type_url == typeurls.HEALTH:
            # A report, not a subscription: never answered (as Istio). Attributed to this
            # stream's proxy and identity only.
            if self._on_health is not None:
                self._on_health(conn.proxy, conn.identity, health_error(req))
            return
        guard = self._guards.get(req.type_url)
        if guard is not None and (names := _guarded_names(conn, req)) is not None:
            try:
                guard(conn.proxy, conn.identity, names)
            except StreamRefused as refused:
                # This stream only: the proxy's other streams (its Envoy's ADS) go on.
                logger.info("stream %s refused: %s", conn.id, refused.message)
                raise StreamError(refused.code, refused.message, kind="refused") from None
        state = conn.state
        outcome: RequestOutcome
        if same_names:  # req has no names: see _read
            assert isinstance(state, SotwStream)
            outcome = state.receive(req, raw, same_names=True)
        else:
            outcome = state.receive(req, raw)
        if outcome.kind is RequestKind.ACK:
            self._acked(conn, req.type_url, req.response_nonce)
        elif outcome.kind is RequestKind.NACK:
            self._record_reject(conn, req)
            logger.warning(
                "%s NACKed %s: %s", conn.proxy.id, _short(req.type_url), outcome.error_message
            )
        elif outcome.kind is RequestKind.STALE:
            self._metrics.stale_requests.labels(metric_type(req.type_url)).inc()
        if outcome.must_respond:
            conn.respond_types = conn.respond_types | {req.type_url}

    def _acked(self, conn: Connection, type_url: str, nonce: str) -> None:
        """What an ACK means beyond the stream's state (already updated): the stream's place
        in admission, and the convergence time of a push."""
        self.acks += 1
        if not conn.settled:
            if not self._admission.unsettled(conn.id):
                conn.settled = True  # its admission window passed: not asked again
            elif conn.state.in_sync():
                self._admission.settled(conn.id)  # its place goes to the next new stream
                conn.settled = True
        nonces = conn.push_nonces
        if nonces is not None:
            pushed = nonces.get(type_url)
            if pushed is not None and pushed[0] == nonce:
                self._convergence.observe(self._clock() - pushed[1])
                del nonces[type_url]
                if not nonces:
                    conn.push_nonces = None  # an emptied dict keeps its table

    def _version_label(self, version: str) -> str:
        """pilot_xds's `version` label: what the proxy claims (ISTIO_VERSION), with the number
        of distinct values capped, since any caller can claim anything."""
        if version in self._versions:
            return version
        if len(self._versions) < _MAX_VERSION_LABELS:
            self._versions.add(version)
            return version
        return "other"

    def _record_reject(self, conn: Connection, req: Any) -> None:
        kind = metric_type(req.type_url)
        self._metrics.rejects.labels(kind).inc()
        gauge = self._metrics.type_rejects.get(kind)
        if gauge is not None:
            err = grpc_code_name(req.error_detail.code)
            gauge.labels(conn.proxy.id, err).inc()
            self._rejected.setdefault(conn.proxy.id, set()).add((kind, err))

    def _forget_rejects(self, proxy_id: str) -> None:
        if proxy_id not in self._rejected:
            return
        if any(c.proxy.id == proxy_id for c in self.connections.values()):
            return  # another stream of the same proxy is still open
        for kind, err in self._rejected.pop(proxy_id):
            self._metrics.type_rejects[kind].remove(proxy_id, err)

    # --- sending ---------------------------------------------------------------------------

    async def _flush(self, conn: Connection, task: asyncio.Task[Any]) -> None:
        """Send whatever the stream has pending, unless another task is already writing to
        it (that task picks the new work up before it lets go). Writes to one stream are
        thereby serialized without a task or a lock per stream. `task`: the caller's."""
        if conn.busy or conn.context is None or conn.closed:
            return
        conn.busy = True
        try:
            while (conn.respond_types or conn.push_pending) and not conn.closed:
                started = self._clock()
                if not await self._send(conn, conn.context, self._collect(conn), started, task):
                    if conn.handler is not None and conn.handler is not task:
                        conn.handler.cancel()  # the handler is blocked reading: end the RPC
                    return
        except (grpc.aio.AioRpcError, grpc.aio.BaseError, asyncio.InvalidStateError) as e:
            # The client went away while we wrote (gRPC raises ExecuteBatchError, a BaseError,
            # for a write on an RPC it has already ended): its handler sees the end too.
            logger.debug("stream %s: write failed: %r", conn.id, e)
        finally:
            conn.busy = False

    async def _push_worker(self) -> None:
        # Asked once, not for every stream it serves.
        task = asyncio.current_task()
        assert task is not None
        try:
            while self._push_queue:
                conn = self._push_queue.popleft()
                conn.queued = False
                if conn.closed:
                    continue
                try:
                    await self._flush(conn, task)
                except Exception:
                    # A bug of ours (a generator failing for this proxy, say): logged, and
                    # the worker goes on with the other streams.
                    self._metrics.internal_errors.inc()
                    logger.exception("stream %s: sending failed", conn.id)
        finally:
            # Always given back: a slot lost here is a stream that is never served (a new
            # worker starts only while fewer run than streams wait).
            self._workers -= 1
            if self._workers == 0 and not self._push_queue:
                self._trimmer.drained()

    async def _send(
        self,
        conn: Connection,
        context: grpc.aio.ServicerContext,
        frames: list[tuple[str, bytes]],
        started: float,
        task: asyncio.Task[Any],
    ) -> bool:
        """Write frames in order; False when the stream must close. A separate coroutine so
        that the encoded bytes are released as soon as they are written, not kept by an idle
        stream until its next push.

        A write that the client does not take within `send_timeout` is cancelled by the
        watchdog (one timer for the whole server instead of one per write: this is the hot
        path of a push)."""
        for type_url, data in frames:
            write_started = self._clock()
            self._writing[conn] = (write_started, task)
            if self._watchdog is None:
                self._start_watchdog()
            try:
                await context.write(data)
            except asyncio.CancelledError:
                if not timed_out(conn):
                    raise
                task.uncancel()  # our watchdog's cancellation, not the worker's
                self._metrics.write_timeouts.inc()
                if type_url in _SEND_ERROR_TYPES:
                    self._metrics.pushes.labels(metric_type(type_url) + "_senderr").inc()
                logger.warning("stream %s: send timed out; closing it", conn.id)
                return False
            finally:
                self._writing.pop(conn, None)
            done = self._clock()
            self._written.written(type_url, data, done - started, done - write_started)
        return True

    def _start_watchdog(self) -> None:
        self._watchdog = asyncio.get_running_loop().create_task(self._watch_writes())

    async def _watch_writes(self) -> None:
        """Cancel writes that have waited longer than `send_timeout` on a client that does
        not read; exits when nothing is being written (and says so: `_watchdog` None, which
        a write checks instead of asking the task)."""
        timeout = self._options.send_timeout
        try:
            while self._writing:
                await asyncio.sleep(min(1.0, timeout / 4))
                now = self._clock()
                for conn, (started, task) in list(self._writing.items()):
                    if now - started > timeout and conn.error is None:
                        conn.error = StreamError(
                            grpc.StatusCode.DEADLINE_EXCEEDED, "client did not read responses"
                        )
                        task.cancel()
        finally:
            if self._watchdog is asyncio.current_task():
                self._watchdog = None

    def _collect(self, conn: Connection) -> list[tuple[str, bytes]]:
        """Decide what to send now; returns encoded responses in order: the pending push's,
        then the answers to requests that it did not answer."""
        forced = conn.respond_types
        conn.respond_types = NO_TYPES
        frames = self._collect_push(conn) if conn.push_pending else []
        if forced:
            answered = {type_url for type_url, _ in frames}
            frames += self._collect_answers(conn, forced - answered)
        return frames

    def _collect_push(self, conn: Connection) -> list[tuple[str, bytes]]:
        """The pending push's responses. On every stream for every push: only what a push
        needs."""
        push_types = conn.push_types
        conn.push_pending = False
        conn.push_types = None
        since = conn.push_since
        # From the push's start (the oldest one coalesced into it) until a send worker took
        # this stream: istiod's time in the push queue.
        self._queue_time.observe(max(0.0, self._clock() - since))
        state = conn.state
        pushed = state.subscribed_among(push_types)
        pushed.discard(typeurls.DEBUG_SYNCZ)  # computed on request only (_collect_answers)
        if not pushed:
            return []
        frames: list[tuple[str, bytes]] = []
        nonces = conn.push_nonces
        for resp in state.push(self._source.resources(conn.proxy, pushed)):
            frames.append((resp.type_url, encode_response(resp, self._control_plane)))
            if nonces is None:
                nonces = conn.push_nonces = {}
            # From the oldest push this response carries (see Connection.push_since).
            nonces[resp.type_url] = (resp.nonce, since)
        return frames

    def _collect_answers(self, conn: Connection, types: frozenset[str]) -> list[tuple[str, bytes]]:
        """Answers to requests that must be answered even when nothing changed (first
        requests, newly subscribed names), in type order."""
        wanted = {t for t in types if t != typeurls.DEBUG_SYNCZ}
        sets = self._source.resources(conn.proxy, wanted) if wanted else {}
        if typeurls.DEBUG_SYNCZ in types:
            # Computed on request from the streams themselves, never pushed.
            sets[typeurls.DEBUG_SYNCZ] = syncz_resources(
                self.connections.values(),
                self._options.control_plane_id,
                conn.identity,
                self._syncz_filter,
            )
        frames: list[tuple[str, bytes]] = []
        for type_url in sorted(types):
            answer = conn.state.respond(type_url, sets.get(type_url, ResourceSet(())), force=True)
            if answer is not None:
                frames.append((type_url, encode_response(answer, self._control_plane)))
        return frames


def _guarded_names(conn: Connection, req: Any) -> list[str] | None:
    """The names a guard must pass: a SotW request's whole list; a delta request's newly
    subscribed names (the earlier ones passed already), or none for its first request of the
    type (a wildcard subscription). None: nothing new to check."""
    if not conn.delta:
        return list(req.resource_names)
    added = list(req.resource_names_subscribe)
    if added or req.type_url not in conn.state.subscribed_types:
        return added
    return None


_MAX_VERSION_LABELS = 32
# The types istiod counts send errors for (pilot_xds_pushes{type="cds_senderr"}, ...).
_SEND_ERROR_TYPES = frozenset(
    (typeurls.CLUSTER, typeurls.ENDPOINT, typeurls.LISTENER, typeurls.ROUTE)
)


def _short(type_url: str) -> str:
    return typeurls.SHORT_NAMES.get(type_url, type_url)
