"""Runs the workload's readiness probe and reports its health (issue 18).

The probe arrives as a `pilotfish.health.v1.WorkloadProbe` resource on the agent's own ADS
stream (this object is the ResponseHandler for that type; the control plane sends the probe
of the WorkloadGroup the agent joins, control/generate/probes.py). No resource: no probe, and
nothing is reported. Each change of health the prober decides (prober.py) is handed to
`report`, which the agent stream sends as Istio's health report (a DiscoveryRequest of type
`istio.io/health`, no error_detail when healthy, the reason in error_detail when not).

Checks go to the probe's host, or the workload's own address when it names none. httpGet and
tcpSocket and grpc run; `exec` does not (one warning; the control plane does not gate such
members on health either).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from google.protobuf.message import Message

from agent.health import checks
from agent.health.prober import Health, Prober, Schedule
from agent.xdsproxy.handlers import HandlerError
from pilotfish_common.lifecycle import Lifecycle
from pilotfish_common.tasks import cancel
from protos import probe_pb2

logger = logging.getLogger(__name__)

RUN_KINDS = frozenset({"http_get", "tcp_socket", "grpc"})


@dataclass(frozen=True, slots=True)
class ProbeSpec:
    kind: str  # the proto's oneof name: http_get, tcp_socket, exec, grpc
    host: str
    port: int
    schedule: Schedule
    path: str = ""  # http_get
    service: str = ""  # grpc
    https: bool = False
    headers: tuple[tuple[str, str], ...] = ()


def spec_of(msg: probe_pb2.WorkloadProbe, default_host: str) -> ProbeSpec:
    """The probe as the agent runs it; zero fields take Kubernetes' defaults."""
    schedule = Schedule(
        initial_delay=float(msg.initial_delay_seconds),
        period=float(msg.period_seconds or 10),
        timeout=float(msg.timeout_seconds or 1),
        success_threshold=msg.success_threshold or 1,
        failure_threshold=msg.failure_threshold or 3,
    )
    kind = msg.WhichOneof("action") or ""
    if kind == "http_get":
        h = msg.http_get
        return ProbeSpec(
            kind,
            h.host or default_host,
            h.port,
            schedule,
            path=h.path or "/",
            https=h.scheme.upper() == "HTTPS",
            headers=tuple(sorted(h.headers.items())),
        )
    if kind == "tcp_socket":
        return ProbeSpec(kind, msg.tcp_socket.host or default_host, msg.tcp_socket.port, schedule)
    if kind == "grpc":
        return ProbeSpec(kind, default_host, msg.grpc.port, schedule, service=msg.grpc.service)
    return ProbeSpec(kind, default_host, 0, schedule)


async def run_check(spec: ProbeSpec) -> str | None:
    """One probe, bounded by its timeout: None on success, else why it failed."""
    try:
        async with asyncio.timeout(spec.schedule.timeout):
            if spec.kind == "http_get":
                return await checks.http_get(
                    spec.host, spec.port, spec.path, https=spec.https, headers=spec.headers
                )
            if spec.kind == "grpc":
                return await checks.grpc_health(spec.host, spec.port, spec.service)
            return await checks.tcp_connect(spec.host, spec.port)
    except TimeoutError:
        return f"probe timed out after {spec.schedule.timeout:g}s"


class HealthChecker(Lifecycle):
    """The WorkloadProbe ResponseHandler and the task that runs the current probe."""

    def __init__(
        self,
        workload_ip: str,
        report: Callable[[Health], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        check: Callable[[ProbeSpec], Awaitable[str | None]] = run_check,
    ) -> None:
        self._ip = workload_ip
        self._report = report
        self._clock = clock
        self._check = check
        self.spec: ProbeSpec | None = None
        self.health: Health | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    async def start(self) -> None:
        """Nothing runs until the control plane sends a probe."""
        self._closed = False

    async def close(self) -> None:
        self._closed = True
        await cancel(self._task)
        self._task = None

    async def __call__(self, resources: Sequence[Message]) -> None:
        if len(resources) > 1:
            raise HandlerError(f"expected at most one WorkloadProbe, got {len(resources)}")
        spec = None
        if resources:
            msg = resources[0]
            if not isinstance(msg, probe_pb2.WorkloadProbe):
                raise HandlerError(f"not a WorkloadProbe: {type(msg).__name__}")
            spec = spec_of(msg, self._ip)
        if spec == self.spec:
            return
        await cancel(self._task)
        self._task = None
        self.spec = spec
        if spec is None or self._closed:
            return
        if spec.kind not in RUN_KINDS:
            logger.warning(
                "%s probes are not run; the workload's health is not reported", spec.kind
            )
            return
        logger.info(
            "probing %s %s:%d every %gs", spec.kind, spec.host, spec.port, spec.schedule.period
        )
        self._task = asyncio.create_task(self._run(spec), name="health-probe")

    async def _run(self, spec: ProbeSpec) -> None:
        prober = Prober(spec.schedule, self._clock())
        while True:
            due = prober.next_probe_at()
            assert due is not None  # no probe is running here
            delay = due - self._clock()
            if delay > 0:
                await asyncio.sleep(delay)
            prober.started(self._clock())
            try:
                error = await self._check(spec)
            except Exception as e:  # a bug of ours must not stop probing for good
                logger.exception("probe failed")
                error = f"probe error: {type(e).__name__}"
            change = prober.finished(self._clock(), error)
            if change is not None:
                self.health = change
                level = logging.INFO if change.healthy else logging.WARNING
                logger.log(
                    level,
                    "workload %s%s",
                    "healthy" if change.healthy else "unhealthy: ",
                    change.reason,
                )
                self._report(change)
