"""Gateway certificates from the control plane: one ADS stream per `kubernetes://` secret
that some SDS stream of Envoy holds, on the agent's one upstream channel (rules in fetch.py).

A secret is fetched while it is held and for `linger` seconds after its last holder let go
(Envoy re-opens an SDS stream after any hiccup; it then finds the secret, or the refusal,
at once instead of waiting for a new fetch). A refusal is remembered while the fetch lives and
retried with backoff (a ReferenceGrant may allow it later). Secrets live in memory only: the
agent never writes them to disk, and never logs their contents.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryResponse

from agent.sds.resources import SecretEntry
from agent.xdsproxy.handlers import serialize
from pilotfish_common.backoff import Backoff
from pilotfish_common.lifecycle import Lifecycle
from pilotfish_common.tasks import cancel

if TYPE_CHECKING:
    from agent.sds.fetch import Outcome

logger = logging.getLogger(__name__)

# `on_update(name, entry)`: the secret's newest value (None: no longer served); called on the
# event loop, also when only the refusal changed (ask `refusal(name)`).
Update = Callable[[str, SecretEntry | None], None]
OpenStream = Callable[[], grpc.aio.StreamStreamCall]


@dataclass(eq=False)
class _Fetch:
    """One `kubernetes://` secret's fetch: who holds it, its stream task, its refusal."""

    name: str
    refs: int = 0
    task: asyncio.Task[None] | None = None
    stop: asyncio.TimerHandle | None = None  # the linger timer after the last release
    refusal: tuple[grpc.StatusCode, str] | None = None
    missing_reported: bool = False
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=1.0, maximum=30.0))


class RemoteSecrets(Lifecycle):
    def __init__(
        self,
        open_stream: OpenStream,
        *,
        node_id: str,
        metadata: Mapping[str, object],
        linger: float = 30.0,
    ) -> None:
        self._open = open_stream
        self._node_id = node_id
        self._metadata = metadata
        self._linger = linger
        self._fetches: dict[str, _Fetch] = {}
        self._on_update: Update = lambda _name, _entry: None

    def bind(self, on_update: Update) -> None:
        self._on_update = on_update

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        fetches, self._fetches = list(self._fetches.values()), {}
        for f in fetches:
            if f.stop is not None:
                f.stop.cancel()
        await cancel(*[f.task for f in fetches if f.task is not None])

    # --- holders ---------------------------------------------------------------------------

    def acquire(self, name: str) -> None:
        f = self._fetches.get(name)
        if f is None:
            f = self._fetches[name] = _Fetch(name)
            f.task = asyncio.create_task(self._run(f), name=f"sds-fetch {name}")
        f.refs += 1
        if f.stop is not None:
            f.stop.cancel()
            f.stop = None

    def release(self, name: str) -> None:
        f = self._fetches.get(name)
        if f is None:
            return
        f.refs -= 1
        if f.refs <= 0 and f.stop is None:
            f.stop = asyncio.get_running_loop().call_later(self._linger, self._stop, f)

    def refusal(self, name: str) -> tuple[grpc.StatusCode, str] | None:
        """(status, message) when the control plane refused this secret."""
        f = self._fetches.get(name)
        return f.refusal if f is not None else None

    @property
    def names(self) -> list[str]:
        return sorted(self._fetches)

    def _stop(self, f: _Fetch) -> None:
        if self._fetches.get(f.name) is not f or f.refs > 0:
            return
        del self._fetches[f.name]
        if f.task is not None:
            f.task.cancel()
        self._on_update(f.name, None)

    # --- one secret's stream ---------------------------------------------------------------

    async def _run(self, f: _Fetch) -> None:
        # The stream's rules and the Secret protos, with the first gateway certificate: an
        # agent that serves none never loads them (agent/sds/names.py).
        await asyncio.to_thread(importlib.import_module, "agent.sds.fetch")
        from agent.sds.fetch import SecretFetch

        while True:
            fetch = SecretFetch(f.name, self._node_id, self._metadata)
            call = self._open()
            try:
                await call.write(serialize(fetch.first_request()))
                async for raw in call:
                    step = fetch.on_response(DiscoveryResponse.FromString(raw))
                    self._apply(f, step.outcome, step.entry, step.error)
                    await call.write(serialize(step.reply))
                code, details = grpc.StatusCode.UNAVAILABLE, "stream closed by the control plane"
            except grpc.aio.AioRpcError as e:
                code, details = e.code(), e.details() or ""
            finally:
                call.cancel()
            end = SecretFetch.on_end(code, details)
            if end.refused:
                if f.refusal != (end.code, end.message):
                    logger.warning(
                        "secret %s refused by the control plane (%s): %s; not served",
                        f.name,
                        end.code.name,
                        end.message,
                    )
                f.refusal = (end.code, end.message)
                self._on_update(f.name, None)  # a refused secret is never served
            else:
                logger.info("secret %s: stream ended (%s); fetching again", f.name, end.message)
            await asyncio.sleep(f.backoff.next_delay())

    def _apply(self, f: _Fetch, outcome: Outcome, entry: SecretEntry | None, error: str) -> None:
        from agent.sds.fetch import Outcome  # imported by `_run` already

        if outcome is Outcome.REJECTED:
            logger.warning("secret %s: unusable response from the control plane: %s", f.name, error)
            return
        f.backoff.reset()
        if f.refusal is not None:
            logger.info("secret %s: allowed again", f.name)
            f.refusal = None
        if outcome is Outcome.MISSING:
            self._on_update(f.name, None)  # deleted, or never there: nothing to serve
            if not f.missing_reported:
                f.missing_reported = True
                logger.warning(
                    "secret %s: the control plane has no such Secret; served once it exists",
                    f.name,
                )
            return
        f.missing_reported = False
        assert entry is not None
        logger.info("secret %s: version %s from the control plane", f.name, entry.version)
        self._on_update(f.name, entry)
