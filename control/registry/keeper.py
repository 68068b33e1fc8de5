"""The lifecycle of auto-registered workloads around the sans-IO `WorkloadRegistry`: which
stream events reach it, when a workload whose proxy left is dropped (the expiry timer), and
how the set survives a restart (`<state dir>/workloads.json`, written 0600 and restored at
start, so a restarted control plane keeps serving those endpoints while proxies reconnect).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from control.ca.identity import Identity
from control.model.peer import ConnectedPeer
from control.model.proxy import Proxy
from control.model.types import MeshConfig, Workload
from control.registry.autoregister import WorkloadRegistry
from control.registry.peers import ConnectedPeers
from pilotfish_common.lifecycle import Lifecycle
from pilotfish_common.tasks import at_deadlines

logger = logging.getLogger(__name__)

REGISTRY_FILE = "workloads.json"
# Saves closer together than this are coalesced (a burst of proxies (dis)connecting).
_SAVE_INTERVAL = 0.2


class WorkloadKeeper(Lifecycle):
    """Feeds stream events to the registry and keeps its set current and persisted; use
    `async with`, or start()/close().

    `register=False` (Kubernetes mode: pods come from the API server) registers no connecting
    proxy. Connected proxies that report standard metrics are tracked either way, for the
    agents' peer table (control/registry/peers.py). Handlers given to `subscribe` are told,
    with no arguments, each time the workload set or the connected peers changed; they must
    return at once (the push pipeline only notes it)."""

    def __init__(
        self,
        registry: WorkloadRegistry,
        *,
        state_dir: str = "",
        register: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self._peers = ConnectedPeers()
        self._path = Path(state_dir) / REGISTRY_FILE if state_dir else None
        self._register = register
        self._clock = clock
        self._handlers: list[Callable[[], None]] = []
        self._expiry_wake = asyncio.Event()
        self._save_wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Restore the saved set (if any), then start the expiry and save loops."""
        await self._restore()
        self._tasks = [asyncio.create_task(self._expire(), name="workload-expiry")]
        if self._path is not None:
            self._tasks.append(asyncio.create_task(self._save(self._path), name="workload-save"))

    async def close(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- the pipeline's view (control.pipeline.WorkloadSource) -----------------------------

    def workloads(self, config: MeshConfig) -> tuple[Workload, ...]:
        """The registered workloads as the WorkloadGroups of `config` (the snapshot being
        built) admit them: a deleted group, or a changed template, changes its members here.
        Subscribers are not told (they are building this snapshot); the new set is saved."""
        if self.registry.set_groups(config.workload_groups):
            self._save_wake.set()
        return self.registry.workloads()

    def connected_peers(self) -> tuple[ConnectedPeer, ...]:
        return self._peers.peers()

    def subscribe(self, handler: Callable[[], None]) -> None:
        self._handlers.append(handler)

    # --- stream events (the xDS server's on_connect / on_disconnect hooks) -----------------

    def proxy_connected(self, proxy: Proxy, identity: Identity | None) -> None:
        """A stream of `proxy`, authenticated as `identity` (None: the plaintext port), was
        admitted: its workload joins (or stays in) the set if its WorkloadGroup admits that
        identity (control/registry/autoregister.py)."""
        if self._peers.connect(proxy, identity):
            self._tell()
        if not self._register:
            return
        if self.registry.connect(proxy, identity):
            self._changed()

    def proxy_disconnected(self, proxy: Proxy, identity: Identity | None) -> None:
        """A stream of `proxy` ended: its workload goes after the grace period unless the
        proxy opens another stream."""
        if self._peers.disconnect(proxy, identity):
            self._tell()
        self.registry.disconnect(proxy, identity, self._clock())
        self._expiry_wake.set()

    def proxy_health(self, proxy: Proxy, identity: Identity | None, error: str | None) -> None:
        """A health report (`error` None: healthy) on a stream of `proxy` authenticated as
        `identity` (the server's on_health hook); a change of what serves is pushed."""
        if self.registry.report_health(proxy, identity, error, time.time()):
            self._changed()

    # --- internals -------------------------------------------------------------------------

    def _changed(self) -> None:
        self._tell()
        self._save_wake.set()

    def _tell(self) -> None:
        for handler in self._handlers:
            handler()

    async def _expire(self) -> None:
        await at_deadlines(self._expiry_wake, self.registry.next_expiry, self._clock, self._expired)

    async def _expired(self, now: float) -> None:
        removed = self.registry.expire(now)
        if removed:
            logger.info("workloads removed after grace: %s", [w.address for w in removed])
            self._changed()

    async def _restore(self) -> None:
        path = self._path
        if path is None:
            return
        try:
            text = await asyncio.to_thread(path.read_text)
            entries = json.loads(text)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            logger.warning("ignoring %s: %s", path, e)
            return
        if isinstance(entries, list):
            n = self.registry.restore(entries, self._clock())
            if n:
                logger.info("restored %d auto-registered workload(s) from %s", n, path)
                self._expiry_wake.set()

    async def _save(self, path: Path) -> None:
        while True:
            await self._save_wake.wait()
            self._save_wake.clear()
            data = json.dumps(self.registry.snapshot(), indent=1)
            try:
                await asyncio.to_thread(_write_private, path, data)
            except OSError as e:
                logger.warning("cannot save %s: %s", path, e)
            await asyncio.sleep(_SAVE_INTERVAL)


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
