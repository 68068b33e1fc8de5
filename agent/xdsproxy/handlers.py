"""ResponseHandler: the public API for consuming or observing xDS types in the agent itself.

    from agent.xdsproxy.handlers import HandlerRegistry

    def on_names(resources):          # decoded protobuf messages of one response
        if not resources:
            raise ValueError("empty name table")   # raising NACKs the response
        ...

    registry.register("type.googleapis.com/istio.networking.nds.v1.NameTable", on_names)

A handler may be a plain function or a coroutine function. Two modes:

- `mode="consume"` (the default): responses of the type never reach Envoy or proxyless
  clients; the agent subscribes to it on its own stream and ACKs it, or NACKs it with the
  exception's message.
- `mode="observe"`: the handler sees each response of the type that is relayed to Envoy or a
  proxyless client, after it was forwarded, without delaying or changing it. Decoding and the
  call happen in a background task fed by a bounded queue: a response that finds the queue
  full is dropped (and counted), not waited for. An exception is logged and counted, never a
  NACK. For delta streams the handler sees the resources the response adds or changes.

Every type `xds-protos` ships (and protobuf's well-known types, and ours in protos/) is
decoded by its type URL (protos/messages.py imports the one generated module that defines
it); a plug-in's own type passes its class as `message_class=`. `register` raises
UnknownHandlerType naming the type when there is no class for it.

Other packages plug handlers in through the entry-point group `pilotfish.agent.handlers`:
each entry point names a callable `setup(registry)` that calls `registry.register(...)`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryResponse, DiscoveryResponse
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError, Message

from agent.xdsproxy.pluginscan import may_declare
from pilotfish_common.tasks import cancel
from protos.messages import UnknownMessageType, message_class

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "pilotfish.agent.handlers"
BUILTIN_PACKAGE = "pilotfish"
# Responses waiting for one observer; beyond either bound they are dropped (an observer is
# an audit or mirror: it must never hold up Envoy's config, nor buffer without bound). The
# byte bound is what matters for big SotW responses (a 1,000-cluster CDS is ~1 MB).
OBSERVE_QUEUE = 16
OBSERVE_QUEUE_BYTES = 16 << 20

ResponseHandler = Callable[[Sequence[Message]], Awaitable[None] | None]
# Fetches what a URI names (a Wasm module for ECDS, agent/xdsproxy/ecds.py).
Fetch = Callable[[str], Awaitable[bytes]]


class ResponseRewriter(Protocol):
    """Changes relayed responses of one type before they are forwarded (ECDS's remote Wasm
    code to local files): the bytes to forward instead, None for unchanged, HandlerError to
    NACK (then nothing is forwarded)."""

    async def rewrite(self, raw: bytes, *, delta: bool) -> bytes | None: ...


Mode = Literal["consume", "observe"]
MODES: tuple[Mode, ...] = ("consume", "observe")


class HandlerError(Exception):
    """A handler rejected a response; the message becomes the NACK's error_detail."""


class UnknownHandlerType(ValueError):
    """`register` was given a type URL with no message class."""


class PluginError(RuntimeError):
    """A plug-in registered something the agent cannot serve: the agent does not start."""


class HandlerObserver(Protocol):
    """Where per-handler events go (the agent's Prometheus metrics)."""

    def handled(self, handler: str, type_url: str, seconds: float) -> None: ...
    def rejected(self, handler: str, type_url: str) -> None: ...
    def observe_error(self, handler: str, type_url: str) -> None: ...
    def observe_dropped(self, handler: str, type_url: str) -> None: ...


@dataclass(frozen=True, eq=False)
class Registration:
    """A response handler as registered: for which type, how it runs, by whom."""

    type_url: str
    handler: ResponseHandler
    mode: Mode
    message_class: type[Message]
    name: str  # the entry point's name, or the handler's qualified name
    package: str  # the distribution that registered it (BUILTIN_PACKAGE for the agent's own)

    def describe(self) -> dict[str, str]:
        return {
            "type_url": self.type_url,
            "handler": self.name,
            "package": self.package,
            "mode": self.mode,
            "message": self.message_class.DESCRIPTOR.full_name,
        }


@dataclass(eq=False)
class HandlerCounts:
    """What one handler did (shown by /debug/handlers)."""

    handled: int = 0
    nacks: int = 0
    observe_errors: int = 0
    observe_dropped: int = 0


@dataclass(eq=False)
class _Loading:
    """The plug-in being loaded and the types it registers."""

    name: str
    package: str
    registered: list[str] = field(default_factory=list)


def _handler_name(handler: object) -> str:
    name = getattr(handler, "__qualname__", None) or type(handler).__qualname__
    module = getattr(handler, "__module__", None) or type(handler).__module__
    return f"{module}.{name}"


def _reason(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


class HandlerRegistry:
    def __init__(self, observer: HandlerObserver | None = None) -> None:
        self._handlers: dict[str, Registration] = {}
        self._consumed: frozenset[str] = frozenset()
        self._observed: frozenset[str] = frozenset()
        self.counts: dict[str, HandlerCounts] = {}
        self.observer = observer
        self._loading: _Loading | None = None
        self._observers: dict[str, _ObserverQueue] = {}
        self.rewriters: dict[str, ResponseRewriter] = {}
        self.fetchers: dict[str, Fetch] = {}

    # --- registration ----------------------------------------------------------------------

    def register(
        self,
        type_url: str,
        handler: ResponseHandler,
        *,
        mode: Mode = "consume",
        message_class: type[Message] | None = None,
    ) -> None:
        if not type_url:
            raise ValueError("type_url is required")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if type_url in self._handlers:
            raise ValueError(f"a handler is already registered for {type_url}")
        cls = message_class or _class_for(type_url)
        loading = self._loading
        reg = Registration(
            type_url=type_url,
            handler=handler,
            mode=mode,
            message_class=cls,
            name=loading.name if loading else _handler_name(handler),
            package=loading.package if loading else BUILTIN_PACKAGE,
        )
        self._handlers[type_url] = reg
        self.counts[type_url] = HandlerCounts()
        if loading is not None:
            loading.registered.append(type_url)
        self._reindex()
        logger.debug("%s handler registered for %s", mode, type_url)

    def register_fetcher(self, scheme: str, fetch: Fetch) -> None:
        """Fetch URIs of `scheme` (e.g. a Wasm module's `oci://` or `https://` source for
        ECDS) with `fetch(uri) -> bytes`; replaces the built-in one for that scheme."""
        if not scheme or not scheme.isascii() or ":" in scheme:
            raise ValueError(f"not a URI scheme: {scheme!r}")
        self.fetchers[scheme.lower()] = fetch
        logger.debug("fetcher registered for %s://", scheme)

    def unregister(self, type_url: str) -> None:
        self._handlers.pop(type_url, None)
        self.counts.pop(type_url, None)
        self._reindex()

    def _reindex(self) -> None:
        # Frozen sets: the relay tests membership on every response.
        regs = self._handlers.values()
        self._consumed = frozenset(r.type_url for r in regs if r.mode == "consume")
        self._observed = frozenset(r.type_url for r in regs if r.mode == "observe")

    def consumes(self, type_url: str) -> bool:
        return type_url in self._consumed

    def observes(self, type_url: str) -> bool:
        return type_url in self._observed

    def __contains__(self, type_url: object) -> bool:
        return type_url in self._handlers

    @property
    def type_urls(self) -> list[str]:
        """The consumed types: what the agent subscribes to on its own stream."""
        return sorted(self._consumed)

    def registrations(self) -> list[Registration]:
        return [self._handlers[t] for t in sorted(self._handlers)]

    def describe(self) -> list[dict[str, object]]:
        """For /debug/handlers."""
        out: list[dict[str, object]] = []
        for reg in self.registrations():
            counts = self.counts.get(reg.type_url, HandlerCounts())
            out.append({**reg.describe(), **counts.__dict__})
        return out

    # --- consume ---------------------------------------------------------------------------

    async def dispatch(self, type_url: str, resources: Sequence[any_pb2.Any]) -> None:
        """Decode and hand a response's resources to its handler; raises HandlerError with
        the reason when the handler (or decoding) fails."""
        reg = self._handlers[type_url]
        counts = self.counts[type_url]
        started = time.perf_counter()
        try:
            await _call(reg.handler, decode(reg, resources))
        except Exception as e:
            counts.nacks += 1
            if self.observer is not None:
                self.observer.rejected(reg.name, type_url)
            if isinstance(e, HandlerError):
                raise
            raise HandlerError(_reason(e)) from e
        finally:
            counts.handled += 1
            if self.observer is not None:
                self.observer.handled(reg.name, type_url, time.perf_counter() - started)

    # --- observe ---------------------------------------------------------------------------

    def observe(self, type_url: str, raw: bytes, *, delta: bool) -> None:
        """Queue a relayed response (its exact bytes) for the type's observer. Never waits:
        the relay calls this after it forwarded the response. Each observer has its own
        queue and task, so a slow one drops only its own responses."""
        reg = self._handlers[type_url]
        queue = self._observers.get(type_url)
        if queue is None:
            queue = self._observers[type_url] = _ObserverQueue(
                lambda raw, delta: self._observe_one(reg, raw, delta)
            )
        if not queue.offer(raw, delta):
            self.counts[type_url].observe_dropped += 1
            if self.observer is not None:
                self.observer.observe_dropped(reg.name, type_url)
            logger.debug("observer of %s is behind; response dropped", type_url)

    async def _observe_one(self, reg: Registration, raw: bytes, delta: bool) -> None:
        counts = self.counts[reg.type_url]
        started = time.perf_counter()
        try:
            if delta:
                dresp = DeltaDiscoveryResponse.FromString(raw)
                resources = [r.resource for r in dresp.resources if r.HasField("resource")]
            else:
                resources = list(DiscoveryResponse.FromString(raw).resources)
            await _call(reg.handler, decode(reg, resources))
        except Exception as e:
            counts.observe_errors += 1
            if self.observer is not None:
                self.observer.observe_error(reg.name, reg.type_url)
            logger.warning("observer %s of %s failed: %s", reg.name, reg.type_url, _reason(e))
        finally:
            counts.handled += 1
            if self.observer is not None:
                self.observer.handled(reg.name, reg.type_url, time.perf_counter() - started)

    async def drain_observers(self) -> None:
        """Wait until every queued response has been observed (tests, benchmarks)."""
        for queue in list(self._observers.values()):
            await queue.join()

    async def close(self) -> None:
        observers, self._observers = self._observers, {}
        for queue in observers.values():
            await queue.close()

    # --- plug-ins --------------------------------------------------------------------------

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> list[str]:
        """Run every `setup(registry)` entry point of `group`; returns their names.

        A plug-in that cannot be loaded, or whose setup fails, is logged and skipped (what it
        registered before failing is taken back): it must not keep the agent from starting.
        A plug-in that registers a type the agent cannot decode is a configuration error the
        operator has to see: PluginError, one line naming the plug-in and the type."""
        # Usually no package declares the group: the agent's start (this is on its critical
        # path, before Envoy is served) then skips importlib.metadata (~20 ms of CPU, and a
        # thread holds the GIL for most of it). Imported here, not at the top, for the same
        # reason.
        if not may_declare(group):
            return []
        from importlib import metadata

        loaded = []
        for ep in metadata.entry_points(group=group):
            package = ep.dist.name if ep.dist is not None else "unknown"
            self._loading = _Loading(ep.name, package)
            try:
                setup: Any = ep.load()
                setup(self)
            except UnknownHandlerType as e:
                raise PluginError(f"handler plug-in {ep.name} ({package}): {e}") from e
            except Exception:
                logger.exception("handler plug-in %s (%s) failed to load", ep.name, ep.value)
                for type_url in self._loading.registered:
                    self.unregister(type_url)
                continue
            finally:
                registered = self._loading.registered
                self._loading = None
            loaded.append(ep.name)
            logger.info(
                "handler plug-in %s (%s) loaded: %s", ep.name, package, ", ".join(registered)
            )
        return loaded


class _ObserverQueue:
    """One observer's pending responses, bounded in count and bytes, and the task that works
    through them (started with the first response, on the relay's loop)."""

    def __init__(self, work: Callable[[bytes, bool], Awaitable[None]]) -> None:
        self._work = work
        self._queue: asyncio.Queue[tuple[bytes, bool]] = asyncio.Queue()
        self._bytes = 0
        self._task: asyncio.Task[None] | None = None

    def offer(self, raw: bytes, delta: bool) -> bool:
        if self._queue.qsize() >= OBSERVE_QUEUE or self._bytes + len(raw) > OBSERVE_QUEUE_BYTES:
            return False
        self._bytes += len(raw)
        self._queue.put_nowait((raw, delta))
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="handler-observer")
        return True

    async def _run(self) -> None:
        while True:
            raw, delta = await self._queue.get()
            try:
                await self._work(raw, delta)
            finally:
                self._bytes -= len(raw)
                self._queue.task_done()

    async def join(self) -> None:
        await self._queue.join()

    async def close(self) -> None:
        await cancel(self._task)
        self._task = None


def _class_for(type_url: str) -> type[Message]:
    try:
        return message_class(type_url)
    except UnknownMessageType as e:
        raise UnknownHandlerType(str(e)) from None


async def _call(handler: ResponseHandler, decoded: list[Message]) -> None:
    result = handler(decoded)
    if inspect.isawaitable(result):
        await result


def decode(reg: Registration, resources: Sequence[any_pb2.Any]) -> list[Message]:
    """The resources as `reg`'s messages. Only the registered type is decoded: a type URL read
    off the wire never makes the agent import anything."""
    out = []
    for a in resources:
        if a.type_url != reg.type_url:
            raise HandlerError(f"resource of type {a.type_url!r} in a {reg.type_url} response")
        try:
            out.append(reg.message_class.FromString(a.value))
        except DecodeError as e:
            raise HandlerError(f"cannot decode {a.type_url!r}: {e}") from None
    return out


def serialize(msg: Message) -> bytes:
    """SerializeToString with a precise type (the generated stubs say Any)."""
    data: bytes = msg.SerializeToString()
    return data
