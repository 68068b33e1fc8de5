"""Per-handler metrics (agent/handlermetrics.py) as /stats/prometheus renders them."""

from __future__ import annotations

import asyncio

import pytest
from envoy.config.cluster.v3.cluster_pb2 import Cluster

from agent.handlermetrics import HandlerMetricsObserver
from agent.metrics import AgentMetrics
from agent.xdsproxy.handlers import HandlerError, HandlerRegistry
from protos import typeurls
from tests.unit.test_handler_registry import packed, sotw


def test_consume_and_observe_events_are_counted_per_handler_and_type() -> None:
    metrics = AgentMetrics()
    registry = HandlerRegistry(observer=HandlerMetricsObserver(metrics))

    def reject_empty(resources: object) -> None:
        if not resources:
            raise ValueError("empty")

    def fail(resources: object) -> None:
        raise RuntimeError("observer bug")

    registry.register(typeurls.CLUSTER, reject_empty)
    registry.register(typeurls.LISTENER, fail, mode="observe")
    asyncio.run(registry.dispatch(typeurls.CLUSTER, packed(Cluster(name="a"))))
    with pytest.raises(HandlerError):
        asyncio.run(registry.dispatch(typeurls.CLUSTER, []))

    async def observe() -> None:
        registry.observe(typeurls.LISTENER, sotw(), delta=False)
        await registry.drain_observers()
        await registry.close()

    asyncio.run(observe())
    text = metrics.render().decode()
    consumer = registry.registrations()[0].name
    observer = registry.registrations()[1].name
    assert (
        f'pilotfish_agent_handler_responses_total{{handler="{consumer}",type="Cluster"}} 2.0'
        in text
    )
    assert (
        f'pilotfish_agent_handler_rejections_total{{handler="{consumer}",type="Cluster"}} 1.0'
        in text
    )
    assert (
        f'pilotfish_agent_handler_duration_seconds_count{{handler="{consumer}",type="Cluster"}} 2.0'
        in text
    )
    assert (
        f'pilotfish_agent_handler_observe_errors_total{{handler="{observer}",type="Listener"}} 1.0'
        in text
    )
    assert (
        f'pilotfish_agent_handler_responses_total{{handler="{observer}",type="Listener"}} 1.0'
        in text
    )
