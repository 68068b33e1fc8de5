"""The push pipeline: config source → mesh index → generator context → the xDS server.

It decides when a push happens (debounced change notifications from the config source and the
workload registry, wire rule 9; or `push_now`), what a push is (full, or EDS only when only
workloads moved) and what is remembered of recent pushes (/debug/pushz). Streams never get
resources from here directly: a push marks them (`PushTarget.push_all`) and the xDS server's
send workers then pull the newest state from `CurrentPush.resources`.
"""

from __future__ import annotations

import array
import functools
import logging
import math
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from control.config.source import ConfigSource, MeshConfigSource
from control.generate import BY_VISIBILITY, Generator, generators_for
from control.generate.conflicts import Conflict
from control.generate.context import GenContext, next_context
from control.metrics import (
    CONFLICT_INBOUND,
    CONFLICT_TCP_OVER_HTTP,
    CONFLICT_TCP_OVER_TCP,
    DUPLICATE_DOMAIN,
    Metrics,
    trigger,
)
from control.model.index import MeshIndex, endpoints_only, rules_of
from control.model.meshconfig import MeshSettings
from control.model.peer import ConnectedPeer
from control.model.proxy import Proxy
from control.model.types import MeshConfig, Workload
from control.model.visibility_index import visibility_class
from control.xds.cache import EMPTY, ResourceCache, ResourceSet
from control.xds.push import PushLoop
from pilotfish_common.lifecycle import Lifecycle
from protos.typeurls import ENDPOINT, PEER_TABLE, SECRET

logger = logging.getLogger(__name__)

# A workload-only change: EDS, and the agents' peer table, which is built from workloads too
# (control/generate/peers.py; only agent streams subscribe to it).
_EDS_ONLY = frozenset((ENDPOINT, PEER_TABLE))
_EDS_AND_SDS = frozenset((ENDPOINT, PEER_TABLE, SECRET))
PUSH_LOG_SIZE = 1024


@dataclass(frozen=True, slots=True)
class PushRecord:
    """One push, for /debug/pushz: when it started (the monotonic clock is the one every
    process on the machine shares, so a load generator can line its own timings up with it),
    why, how long its changes waited in the debounce, and what it pushed to how many streams."""

    seq: int
    started: float  # time.monotonic()
    started_unix: float  # time.time()
    reasons: tuple[str, ...]
    debounce: float  # seconds from the first change it carries to its start
    eds_only: bool
    streams: int
    # File mode: time.monotonic() when the scan of the config files it carries began (every
    # file written before that is in it; ConfigSource.snapshot_at). None in Kubernetes mode.
    config_snapshot: float | None = None

    def as_json(self) -> dict[str, object]:
        return {
            "seq": self.seq,
            "started_monotonic": self.started,
            "started_unix": self.started_unix,
            "reasons": list(self.reasons),
            "debounce_seconds": self.debounce,
            "eds_only": self.eds_only,
            "streams": self.streams,
            "config_snapshot_monotonic": self.config_snapshot,
        }


class PushLog:
    """The most recent `size` pushes, oldest first, in storage allocated once.

    A deque of PushRecords grew by a record, its reasons tuple, its seq and its floats per
    push (about 270 bytes) until it was full, 1,024 pushes in: eight and a half minutes at
    the soak's two pushes a second, a slope in the control plane's RSS long after its
    warm-up (tests/benchmarks/xds_soak.py). Here the fields live in arrays sized at
    construction, so a push writes numbers into place and allocates nothing that outlives
    it; the reasons are shared tuples (a push's reasons come from a handful of names).
    Records are made only when read (/debug/pushz)."""

    __slots__ = ("_eds_only", "_floats", "_ints", "_reasons", "_shared", "_size", "_total")

    # Distinct reason tuples kept to be shared; beyond this many, each push keeps its own
    # (bounded by the log's size still).
    _SHARED_REASONS = 64

    def __init__(self, size: int = PUSH_LOG_SIZE) -> None:
        if size < 1:
            raise ValueError(f"push log size must be at least 1, not {size}")
        self._size = size
        self._total = 0  # pushes ever appended: the next one goes to slot _total % size
        # Per slot: started, started_unix, debounce, config_snapshot (NaN for None).
        self._floats = array.array("d", bytes(8 * 4 * size))
        self._ints = array.array("q", bytes(8 * 2 * size))  # per slot: seq, streams
        self._eds_only = bytearray(size)
        self._reasons: list[tuple[str, ...]] = [()] * size
        self._shared: dict[tuple[str, ...], tuple[str, ...]] = {}

    def append(
        self,
        seq: int,
        started: float,
        started_unix: float,
        reasons: Iterable[str],
        debounce: float,
        eds_only: bool,
        streams: int,
        config_snapshot: float | None,
    ) -> None:
        i = self._total % self._size
        f = 4 * i
        self._floats[f] = started
        self._floats[f + 1] = started_unix
        self._floats[f + 2] = debounce
        self._floats[f + 3] = math.nan if config_snapshot is None else config_snapshot
        self._ints[2 * i] = seq
        self._ints[2 * i + 1] = streams
        self._eds_only[i] = eds_only
        self._reasons[i] = self._share(tuple(sorted(reasons)))
        self._total += 1

    def _share(self, reasons: tuple[str, ...]) -> tuple[str, ...]:
        found = self._shared.get(reasons)
        if found is not None:
            return found
        if len(self._shared) < self._SHARED_REASONS:
            self._shared[reasons] = reasons
        return reasons

    def __len__(self) -> int:
        return min(self._total, self._size)

    def __iter__(self) -> Iterator[PushRecord]:
        first = self._total - len(self)
        for n in range(first, self._total):
            yield self._record(n % self._size)

    def _record(self, i: int) -> PushRecord:
        f = 4 * i
        snapshot = self._floats[f + 3]
        return PushRecord(
            self._ints[2 * i],
            self._floats[f],
            self._floats[f + 1],
            self._reasons[i],
            self._floats[f + 2],
            bool(self._eds_only[i]),
            self._ints[2 * i + 1],
            None if math.isnan(snapshot) else snapshot,
        )


class WorkloadSource(Protocol):
    """The workloads connected proxies registered, and the connected proxies the agents' peer
    table names (control/registry/keeper.py).

    Contract: `workloads(config)` and `connected_peers()` are cheap reads on the event loop
    (the set as the WorkloadGroups of the snapshot being built admit it); a handler given to
    `subscribe` is called with no arguments, on the event loop, each time either changed, and
    must return at once (the pipeline only notes that a push is due)."""

    def workloads(self, config: MeshConfig) -> tuple[Workload, ...]: ...

    def connected_peers(self) -> tuple[ConnectedPeer, ...]: ...

    def subscribe(self, handler: Callable[[], None]) -> None: ...


class PushTarget(Protocol):
    """Where a push goes: the xDS server.

    Contract: `push_all(types)` marks every stream for a push of `types` (None: every
    subscribed type) and returns how many streams it marked; it does not generate or write
    anything itself, so it never calls back into the pipeline while it runs. The streams
    then read the new state through `CurrentPush` (the server's ResourceSource)."""

    def push_all(self, types: frozenset[str] | None = None) -> int: ...


_CONFLICT_GAUGES = {
    Conflict.INBOUND: CONFLICT_INBOUND,
    Conflict.TCP_OVER_TCP: CONFLICT_TCP_OVER_TCP,
    Conflict.TCP_OVER_HTTP: CONFLICT_TCP_OVER_HTTP,
    Conflict.DUPLICATE_DOMAIN: DUPLICATE_DOMAIN,
}


class CurrentPush:
    """The newest push's mesh index and generator context: what every stream's resources are
    generated from. It is the xDS server's ResourceSource."""

    def __init__(
        self,
        cache: ResourceCache,
        metrics: Metrics,
        *,
        trust_domain: str,
        outbound_traffic_policy: str,
    ) -> None:
        self.cache = cache
        self._metrics = metrics
        self._trust_domain = trust_domain
        self._outbound = outbound_traffic_policy
        self._mesh = MeshSettings(
            trust_domain=trust_domain, outbound_traffic_policy=outbound_traffic_policy
        )
        self._version = 0
        self._ctx = GenContext(
            MeshIndex(
                MeshConfig(),
                trust_domain=trust_domain,
                outbound_traffic_policy=outbound_traffic_policy,
            ),
            cache,
        )
        self._started = time.monotonic()
        # This push's sets of the BY_VISIBILITY generators, by (generator, visibility class,
        # locality): one per class, not a walk of the generator's lookups per stream. Emptied
        # whenever the generator context changes (advance), so a set never outlives its push.
        self._by_class: dict[tuple[Generator, Hashable, str], ResourceSet] = {}
        # Istio's conflict gauges: what generating the current push has met so far.
        for kind, name in _CONFLICT_GAUGES.items():
            metrics.conflicts[name].set_function(functools.partial(self._conflicts, kind))

    @property
    def index(self) -> MeshIndex:
        return self._ctx.index

    def _conflicts(self, kind: Conflict) -> int:
        return self._ctx.conflicts.count(kind)

    def advance(
        self,
        config: MeshConfig,
        workloads: Iterable[Workload],
        started: float | None = None,
        mesh: MeshSettings | None = None,
        peers: tuple[ConnectedPeer, ...] = (),
    ) -> MeshIndex:
        """Move to the index of a new snapshot; returns the previous index. `started`: when
        the push that carries it began (None: the snapshot is not pushed, as at startup).
        `mesh`: the mesh config in effect (None: as before; its outbound traffic policy
        replaces the constructor's, the trust domain stays the one the process started with).
        `peers`: the connected proxies the agents' peer table names besides the index's
        workloads (they change PEER_TABLE only: control/generate/peers.py)."""
        if started is not None:
            self._started = started
        if mesh is not None:
            self._mesh = mesh
            self._outbound = mesh.outbound_traffic_policy
        previous = self._ctx.index
        self._version += 1
        # Derived from the previous index when only workloads changed (MeshIndex.next), and
        # then generated incrementally over the previous push (GenContext).
        index = previous.next(
            config,
            workloads,
            trust_domain=self._trust_domain,
            version=self._version,
            outbound_traffic_policy=self._outbound,
            mesh=self._mesh,
        )
        self._ctx = next_context(self._ctx, index, peers)
        self._by_class = {}
        return previous

    # --- ResourceSource (for the xDS server) -----------------------------------------------

    def resources(self, proxy: Proxy, type_urls: Iterable[str]) -> dict[str, ResourceSet]:
        ctx = self._ctx
        before = self.cache.serializations
        out: dict[str, ResourceSet] = {}
        generators = generators_for(proxy)
        by_class = self._by_class
        for t in type_urls:
            gen = generators.get(t)
            if gen is None:
                out[t] = EMPTY
            elif gen in BY_VISIBILITY:
                # Locality load balancing makes EDS depend on where the proxy is, too.
                key = (gen, visibility_class(proxy), proxy.locality)
                found = by_class.get(key)
                if found is None:
                    found = by_class[key] = gen(ctx, proxy)
                out[t] = found
            else:
                out[t] = gen(ctx, proxy)
        made = self.cache.serializations - before
        if made:
            self._metrics.serializations.inc(made)
        return out

    def push_started_at(self) -> float:
        return self._started


class PushPipeline(Lifecycle):
    """Turns config and workload changes into pushes; `async with`, or start()/close().

    The config source hands each new config over (ConfigSource.subscribe); the pipeline keeps
    the one it was handed and never reads the source's config back, except once at start()
    for the first one (sources do not hand that over). The mesh config source (Istio's
    MeshConfig, optional) is a second input handled the same way."""

    def __init__(
        self,
        source: ConfigSource,
        workloads: WorkloadSource,
        current: CurrentPush,
        target: PushTarget,
        metrics: Metrics,
        *,
        quiet: float = 0.1,
        max_delay: float = 10.0,
        mesh: MeshConfigSource | None = None,
    ) -> None:
        self._source = source
        self._mesh_source = mesh
        self._mesh: MeshSettings | None = None
        self._workloads = workloads
        self._current = current
        self._target = target
        self._metrics = metrics
        self._config = MeshConfig()
        self._loop = PushLoop(self._push, quiet=quiet, max_delay=max_delay)
        self.pushes = 0
        self.push_log = PushLog()
        source.subscribe(self._config_changed)
        workloads.subscribe(self._workloads_changed)
        if mesh is not None:
            mesh.subscribe(self._mesh_changed)

    async def start(self) -> None:
        """Build the first snapshot from the source's initial config (the source has
        started) and start the debounce loop."""
        self._config = self._source.current
        if self._mesh_source is not None:
            self._mesh = self._mesh_source.current
        self._rebuild()
        await self._loop.start()

    async def close(self) -> None:
        await self._loop.close()

    def notify(self, reason: str) -> None:
        """Something the snapshot is built from changed: push after the debounce."""
        self._loop.notify(reason)

    def push_now(self, reasons: Iterable[str] = ("manual",), waited: float = 0.0) -> int:
        """Rebuild the index from the current config and workloads and push to every stream
        (skips the debounce; benchmarks and tests use it). Returns the streams marked.

        When services, Sidecars, security policies and traffic rules are unchanged, only
        workloads moved: the new index is derived from the previous one and names the
        services that select a changed workload. That changes their endpoints and nothing
        else (clusters, listeners and routes are built from those objects alone), so only EDS
        is pushed, as Istio's incremental EDS push does, and only those services' assignments
        are regenerated. The exception is a change of the identities behind a service (the
        SANs its mTLS clusters accept), which Istio answers with a full push too. A Secret
        whose contents alone changed (a rotation) adds SDS to such a push."""
        started = time.monotonic()
        wall = time.time()
        old_index = self._rebuild(started)
        # Building the new index and generator context: what istiod calls its push context.
        self._metrics.push_context_init.observe(time.monotonic() - started)
        self.pushes += 1
        eds_only = endpoints_only(old_index, self._current.index)
        if eds_only:
            self._metrics.eds_only_pushes.inc()
            types = _EDS_ONLY
            if old_index.config.secrets != self._current.index.config.secrets:
                # A rotated certificate: only the SDS streams holding it get anything.
                types = _EDS_AND_SDS
            streams = self._target.push_all(types)
        else:
            streams = self._target.push_all()
        self.push_log.append(
            self.pushes,
            started,
            wall,
            reasons,
            waited,
            eds_only,
            streams,
            self._source.snapshot_at,
        )
        return streams

    def _rebuild(self, started: float | None = None) -> MeshIndex:
        workloads = self._workloads.workloads(self._config)
        previous = self._current.advance(
            self._config, workloads, started, self._mesh, self._workloads.connected_peers()
        )
        self._metrics.services.set(len(self._current.index.services))
        self._metrics.virtual_services.set(len(self._config.virtual_services))
        mesh_errors = len(self._mesh_source.errors) if self._mesh_source is not None else 0
        self._metrics.config_errors.set(len(self._source.errors) + mesh_errors)
        return previous

    async def _push(self, reasons: set[str], waited: float) -> None:
        self._metrics.debounce.observe(waited)
        for r in reasons or {"unknown"}:
            self._metrics.push_triggers.labels(trigger(r)).inc()
        self.push_now(reasons, waited)

    def _config_changed(self, config: MeshConfig) -> None:
        self._config = config
        self._loop.notify("config")

    def _mesh_changed(self, mesh: MeshSettings) -> None:
        self._mesh = mesh
        self._loop.notify("meshconfig")

    def _workloads_changed(self) -> None:
        self._loop.notify("registry")


def _shape(config: MeshConfig) -> tuple[object, ...]:
    """The config objects that clusters, listeners and routes are built from. A
    VirtualService or DestinationRule change is a full push: it can add or remove clusters
    (subsets), change cluster settings, routes and TCP listeners. When two snapshots have
    the same shape, the index of the second is derived from the first's (MeshIndex.next)
    and the push may be EDS only (endpoints_only)."""
    return rules_of(config)
