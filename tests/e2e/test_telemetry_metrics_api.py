"""Telemetry API `metrics` end to end: two pods (agent + real Envoy + app), the metrics read
from each agent's `/stats/prometheus`, Telemetry objects written while the proxies run.

- A Telemetry on the backend disabling REQUEST_COUNT for SERVER and removing
  `request_protocol`: the backend's agent stops exporting its `istio_requests_total` and its
  other metrics lose the label (their counts summed, none lost); the client, which the
  Telemetry does not select, is unchanged. Deleted again: everything is back, with the
  requests counted meanwhile.
- `ALL_METRICS` disabled on the backend: its Envoy runs no metrics logger any more, and its
  agent counts nothing new; the client still does.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.e2e.test_gateway_telemetry import metrics
from tests.e2e.test_telemetry_access_logs import Pods, get, pods_dir, start_pods, write
from tests.support.apps import EchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.envoyadmin import (
    draining,
    dynamic_listeners,
    metric_overrides,
    metrics_loggers,
)
from tests.support.net import pod_ip
from tests.support.promtext import Exposition

pytestmark = pytest.mark.envoy
__all__ = ["pods_dir"]  # the fixture, used by name

OVERRIDES = """\
    apiVersion: telemetry.istio.io/v1
    kind: Telemetry
    metadata: {name: backend-metrics, namespace: default}
    spec:
      selector: {matchLabels: {app: backend}}
      metrics:
      - providers: [{name: prometheus}]
        overrides:
        - match: {metric: REQUEST_COUNT, mode: SERVER}
          disabled: true
        - tagOverrides: {request_protocol: {operation: REMOVE}}
    """
ALL_OFF = """\
    apiVersion: telemetry.istio.io/v1
    kind: Telemetry
    metadata: {name: backend-metrics, namespace: default}
    spec:
      selector: {matchLabels: {app: backend}}
      metrics:
      - overrides: [{match: {metric: ALL_METRICS}, disabled: true}]
    """
DEST = {"reporter": "destination", "destination_app": "backend"}
SOURCE = {"reporter": "source", "source_app": "client", "response_code": "200"}


async def metrics_logger(ip: str) -> str | None:
    """Whether the pod's Envoy runs metrics loggers now ("on", or "on+overrides" when they
    carry overrides; "off": none), once nothing from before a change is draining."""
    dump = await dynamic_listeners(ip)
    if dump is None or await draining(ip) != 0:
        return None
    if not metrics_loggers(dump):
        return "off"
    return "on+overrides" if metric_overrides(dump) else "on"


async def settled(ip: str, want: str) -> bool:
    return await metrics_logger(ip) == want


def durations(e: Exposition, **labels: str) -> float:
    return e.total("istio_request_duration_milliseconds_count", **labels)


async def _counted(pods: Pods, ip: str, want: dict[str, float]) -> Exposition | None:
    """The pod's exposition once each named total has the wanted value."""
    e = await metrics(ip)
    got = {
        "requests": e.total("istio_requests_total", **DEST),
        "durations": durations(e, **DEST),
        "source": e.total("istio_requests_total", **SOURCE),
    }
    return e if all(got[k] == v for k, v in want.items()) else None


async def send(pods: Pods, path: str, n: int) -> None:
    for i in range(n):
        assert await get(pods.url(f"{path}/{i}")) == 200


async def test_metric_overrides_apply_hot(tmp_path: Path, pods_dir: tuple[Path, Path]) -> None:
    cfg, _ = pods_dir
    client_ip, backend_ip = pod_ip(), pod_ip()
    app = EchoApp("backend", backend_ip, 8080)
    await app.start()
    async with running_control_plane(cfg) as cp:
        pods = await start_pods(cp, tmp_path, client_ip, backend_ip)
        try:
            for ip in (client_ip, backend_ip):
                await eventually(lambda ip=ip: settled(ip, "on"), timeout=30, what="loggers")
            await send(pods, "/before", 5)
            # Every request that reached the backend, warm-up included, counted once.
            served = len(app.headers_seen)
            before = await eventually(
                lambda: _counted(pods, backend_ip, {"requests": served, "durations": served}),
                timeout=20,
                what="the backend's counts",
            )
            assert {s.get("request_protocol") for s in before.series("istio_requests_total")} == {
                "http"
            }
            # And by the client: every 200 it got.
            await eventually(
                lambda: _counted(pods, client_ip, {"source": served}),
                timeout=20,
                what="the client's counts",
            )

            write(cfg / "telemetry.yaml", OVERRIDES)
            await eventually(
                lambda: settled(backend_ip, "on+overrides"), timeout=30, what="overrides"
            )
            assert await metrics_logger(client_ip) == "on"  # not selected
            await send(pods, "/after", 7)
            after = await eventually(
                lambda: _counted(pods, backend_ip, {"durations": served + 7}),
                timeout=20,
                what="the requests since",
            )
            # The backend's server side exports no request count; the rest lost the label,
            # their series summed (the count above is over all of them, before and after).
            assert after.total("istio_requests_total", reporter="destination") == 0
            dest = [s for s in after.series("istio_request_duration_milliseconds_count")]
            assert dest and all("request_protocol" not in s for s in dest), dest
            assert all(
                "request_protocol" not in s for s in after.series("istio_request_bytes_count")
            )
            # Removing one label folded the series, it kept the others.
            assert any(
                s.get("source_workload") == "client" and s.get("response_code") == "200"
                for s in dest
            ), dest
            # The client is not selected: its count goes on, with the label.
            client = await eventually(
                lambda: _counted(pods, client_ip, {"source": served + 7}),
                timeout=20,
                what="the client's counts",
            )
            assert {s.get("request_protocol") for s in client.series("istio_requests_total")} == {
                "http"
            }

            # Deleted: back as Istio's, the requests counted meanwhile included.
            (cfg / "telemetry.yaml").unlink()
            await eventually(lambda: settled(backend_ip, "on"), timeout=30, what="no overrides")
            await send(pods, "/again", 2)
            back = await eventually(
                lambda: _counted(
                    pods, backend_ip, {"requests": served + 9, "durations": served + 9}
                ),
                timeout=20,
                what="the request count back",
            )
            # What was recorded while every exported metric dropped the label has none: those
            # read `unknown` now, the others say what they were.
            protocols = {"http": 0.0, "unknown": 0.0}
            for (name, labels), value in back.samples.items():
                if name == "istio_requests_total" and ("reporter", "destination") in labels:
                    protocols[dict(labels)["request_protocol"]] += value
            assert protocols == {"http": served + 2, "unknown": 7}

            # Every metric off: no logger at all, nothing new counted on the backend.
            write(cfg / "telemetry.yaml", ALL_OFF)
            await eventually(lambda: settled(backend_ip, "off"), timeout=30, what="logger off")
            entries = (await metrics(backend_ip)).total("pilotfish_agent_metrics_entries_total")
            await send(pods, "/off", 3)
            await eventually(
                lambda: _counted(pods, client_ip, {"source": served + 12}),
                timeout=20,
                what="the client still counting",
            )
            # The client's entries for these have arrived; the backend's would have been
            # flushed on the same schedule (every second), so two more seconds is plenty.
            await asyncio.sleep(2)
            quiet = await metrics(backend_ip)
            assert quiet.total("pilotfish_agent_metrics_entries_total") == entries
        finally:
            pods.client.kill()
            pods.backend.kill()
    await app.close()
