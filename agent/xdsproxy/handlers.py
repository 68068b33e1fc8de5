"""ResponseHandler: the public API for consuming xDS types in the agent itself.

    from agent.xdsproxy.handlers import HandlerRegistry

    def on_names(resources):          # decoded protobuf messages of one response
        if not resources:
            raise ValueError("empty name table")   # raising NACKs the response
        ...

    registry.register("type.googleapis.com/istio.networking.nds.v1.NameTable", on_names)

A handler may be a plain function or a coroutine function. Responses of a registered type
never reach Envoy or proxyless clients; the agent ACKs them, or NACKs them with the
exception's message. Other packages plug handlers in through the entry-point group
`pilotfish.agent.handlers`: each entry point names a callable `setup(registry)` that calls
`registry.register(...)`.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from importlib import metadata
from typing import Any

from google.protobuf import any_pb2, message_factory, symbol_database
from google.protobuf.message import Message

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "pilotfish.agent.handlers"

ResponseHandler = Callable[[Sequence[Message]], Awaitable[None] | None]


class HandlerError(Exception):
    """A handler rejected a response; the message becomes the NACK's error_detail."""


class HandlerRegistry:
    def __init__(self) -> None:
        self._handlers: dict[str, ResponseHandler] = {}

    def register(self, type_url: str, handler: ResponseHandler) -> None:
        if not type_url:
            raise ValueError("type_url is required")
        if type_url in self._handlers:
            raise ValueError(f"a handler is already registered for {type_url}")
        self._handlers[type_url] = handler
        logger.debug("handler registered for %s", type_url)

    def unregister(self, type_url: str) -> None:
        self._handlers.pop(type_url, None)

    def __contains__(self, type_url: object) -> bool:
        return type_url in self._handlers

    @property
    def type_urls(self) -> list[str]:
        return sorted(self._handlers)

    async def dispatch(self, type_url: str, resources: Sequence[any_pb2.Any]) -> None:
        """Decode and hand a response's resources to its handler; raises HandlerError with
        the reason when the handler (or decoding) fails."""
        handler = self._handlers[type_url]
        try:
            decoded = [decode_any(a) for a in resources]
            result = handler(decoded)
            if inspect.isawaitable(result):
                await result
        except HandlerError:
            raise
        except Exception as e:
            raise HandlerError(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from e

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> list[str]:
        """Run every `setup(registry)` entry point of `group`; returns their names. A broken
        plug-in is logged and skipped: it must not keep the agent from starting."""
        loaded = []
        for ep in metadata.entry_points(group=group):
            try:
                setup: Any = ep.load()
                setup(self)
            except Exception:
                logger.exception("handler plug-in %s (%s) failed to load", ep.name, ep.value)
                continue
            loaded.append(ep.name)
            logger.info("handler plug-in %s loaded", ep.name)
        return loaded


def decode_any(a: any_pb2.Any) -> Message:
    """Decode an Any into its message class from the default descriptor pool."""
    name = a.type_url.rpartition("/")[2]
    pool = symbol_database.Default().pool
    try:
        descriptor = pool.FindMessageTypeByName(name)
    except KeyError:
        raise HandlerError(f"unknown resource type {a.type_url!r}") from None
    cls = message_factory.GetMessageClass(descriptor)
    msg = cls()
    if not a.Unpack(msg):
        raise HandlerError(f"cannot decode {a.type_url!r}")
    return msg


def serialize(msg: Message) -> bytes:
    """SerializeToString with a precise type (the generated stubs say Any)."""
    data: bytes = msg.SerializeToString()
    return data
