"""The control plane reading its connected agents' standard metrics itself (no Prometheus).

Every `interval` seconds while someone looks at the graph, `AgentScraper` GETs
`http://<proxy ip>:<status port>/stats/prometheus` of each connected proxy (the port from node
metadata `STATUS_PORT` when the agent announces one, else 15020), a few at a time, each with
a short timeout, parses the Istio series in a worker thread and adds one `Snapshot` to the
history. A target that fails is reported in the snapshot's `errors` and simply missing from
that round. Nobody looking for `idle_after` seconds stops the rounds; the next request for
the graph starts them again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import aiohttp

from control.ui.history import SnapshotHistory
from control.ui.promtext import PromTextError, parse_samples
from control.ui.samples import FlowCounters, LabelSet, Snapshot, TargetSamples, aggregate
from pilotfish_common.lifecycle import Lifecycle
from pilotfish_common.tasks import cancel

logger = logging.getLogger(__name__)

DEFAULT_STATUS_PORT = 15020
# An agent's page holds all of its Envoy's stats; more than this is not an agent's.
MAX_BODY = 32 << 20


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    name: str  # "ip:port", also the key of its samples in a Snapshot
    url: str


def scrape_targets(proxies: Iterable[tuple[str, str, int]]) -> list[ScrapeTarget]:
    """One target per distinct (ip, port) of the connected proxies given as (type, ip,
    status port; 0 = the default). Only sidecars and routers run an agent with a status
    server; other streams (pilotfish-ctl, a bare gRPC client) are left out."""
    out: dict[str, ScrapeTarget] = {}
    for kind, ip, port in proxies:
        if kind not in ("sidecar", "router") or not ip:
            continue
        host = f"[{ip}]" if ":" in ip else ip
        name = f"{host}:{port or DEFAULT_STATUS_PORT}"
        out.setdefault(name, ScrapeTarget(name, f"http://{name}/stats/prometheus"))
    return sorted(out.values(), key=lambda t: t.name)


class AgentScraper(Lifecycle):
    name = "agents"

    def __init__(
        self,
        targets: Callable[[], list[ScrapeTarget]],
        *,
        interval: float = 2.0,
        timeout: float = 1.5,
        concurrency: int = 16,
        idle_after: float = 600.0,
        history: SnapshotHistory | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._targets = targets
        self.interval = interval
        self._timeout = timeout
        self._limit = asyncio.Semaphore(max(1, concurrency))
        self._idle_after = idle_after
        self.history = history or SnapshotHistory()
        self._clock = clock
        self._wanted_at = -float("inf")
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self.rounds = 0

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self._timeout),
            # Proxies in the environment are for the internet, not for pod IPs.
            trust_env=False,
        )
        self._task = asyncio.create_task(self._run(), name="ui-scraper")

    async def close(self) -> None:
        await cancel(self._task)
        self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def wanted(self) -> None:
        """Someone looks at the graph: keep (or start) scraping."""
        self._wanted_at = self._clock()
        self._wake.set()

    async def window(self, seconds: float) -> tuple[Snapshot, Snapshot] | None:
        self.wanted()
        return self.history.window(seconds)

    async def _run(self) -> None:
        while True:
            if self._clock() - self._wanted_at > self._idle_after:
                self._wake.clear()
                await self._wake.wait()
            started = self._clock()
            try:
                await self.scrape_once()
            except Exception:  # one bad round must not end the dashboard's data
                logger.exception("scrape round failed")
            took = self._clock() - started
            # A round that takes longer than the interval (thousands of agents) is followed
            # by a pause as long as itself: scraping never takes more than half the time.
            await asyncio.sleep(max(self.interval - took, took))

    async def scrape_once(self) -> Snapshot:
        targets = self._targets()
        results = await asyncio.gather(*(self._scrape(t) for t in targets))
        read: dict[str, TargetSamples] = {}
        errors: dict[str, str] = {}
        for target, result in zip(targets, results, strict=True):
            if isinstance(result, str):
                errors[target.name] = result
            else:
                read[target.name] = result
        snapshot = Snapshot(self._clock(), read, errors)
        self.history.add(snapshot)
        self.rounds += 1
        return snapshot

    async def _scrape(self, target: ScrapeTarget) -> TargetSamples | str:
        """The target's samples, or why it could not be read (one line)."""
        assert self._session is not None
        async with self._limit:
            try:
                async with self._session.get(target.url) as response:
                    if response.status != 200:
                        return f"HTTP {response.status}"
                    body = await response.content.read(MAX_BODY + 1)
                    at = self._clock()
            except TimeoutError:
                return f"no answer within {self._timeout:g}s"
            except (aiohttp.ClientError, OSError) as e:
                return str(e) or type(e).__name__
        if len(body) > MAX_BODY:
            return f"more than {MAX_BODY >> 20} MiB of metrics"
        try:
            flows = await asyncio.to_thread(_read, body)
        except PromTextError as e:
            return str(e)
        return TargetSamples(at, flows)


def _read(body: bytes) -> dict[LabelSet, FlowCounters]:
    return aggregate(parse_samples(body.decode("utf-8", "replace")))
