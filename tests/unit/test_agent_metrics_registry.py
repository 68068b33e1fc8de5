"""The agent's own metric values (agent/metrics.py) render exactly as prometheus_client's
Counter, Gauge and Histogram render the same events, and keeping them costs the agent's
start no prometheus_client import (issue 23)."""

from __future__ import annotations

import re

import prometheus_client

from agent.metrics import Counter, Gauge, Histogram, MetricsRegistry
from tests.support.fresh import fresh_lines

BUCKETS = (0.001, 0.01, 0.1, 1.0)


def _without_created(text: bytes) -> str:
    # `_created` is each series' creation time: the two registries create theirs apart.
    return re.sub(r"(_created(\{[^}]*\})?) \S+", r"\1 T", text.decode())


def test_exposition_matches_prometheus_client() -> None:
    ours = MetricsRegistry()
    theirs = prometheus_client.CollectorRegistry(auto_describe=True)
    for registry, (counter, gauge, histogram) in (
        (ours, (Counter, Gauge, Histogram)),
        (theirs, (prometheus_client.Counter, prometheus_client.Gauge, prometheus_client.Histogram)),
    ):
        plain = counter("x_events", "Events.", registry=registry)
        by_type = counter("x_requests", "Requests by type.", ["type"], registry=registry)
        unused = counter("x_unused", "Never incremented, labelled.", ["class"], registry=registry)
        level = gauge("x_level", "A level.", registry=registry)
        computed = gauge("x_remaining", "Computed at scrape.", ["name"], registry=registry)
        latency = histogram(
            "x_seconds", "Latency.", ["handler", "type"], buckets=BUCKETS, registry=registry
        )
        plain.inc()
        plain.inc(2.5)
        by_type.labels("Cluster").inc()
        by_type.labels(type="Listener").inc(3)
        by_type.labels("Cluster").inc()
        level.inc(2)
        level.inc(-1)
        computed.labels("default").set_function(lambda: 42.0)
        for v in (0.0005, 0.002, 0.05, 0.05, 3.0):
            latency.labels("h", "T").observe(v)
        assert unused is not None
    mine = ours.render()
    assert _without_created(mine) == _without_created(prometheus_client.generate_latest(theirs))
    assert b'x_requests_total{type="Cluster"} 2.0' in mine
    assert b'x_seconds_bucket{handler="h",le="0.1",type="T"} 4.0' in mine
    assert b"x_remaining{name=" in mine and b"42.0" in mine


def test_wrong_label_count_is_an_error() -> None:
    c = Counter("x_total_by", "By two labels.", ["a", "b"], registry=MetricsRegistry())
    try:
        c.labels("only-one")
    except ValueError as e:
        assert "expected labels" in str(e)
    else:
        raise AssertionError("one label value for two label names was accepted")


def test_agent_start_imports_no_prometheus_client() -> None:
    """What the agent imports to start (agent/app.py and all it pulls in, with Envoy's
    standard metrics) does not include
    prometheus_client or the HTTP servers, urllib and email modules its package imports:
    they load at the first scrape."""
    code = (
        "import sys, agent.__main__, agent.launch, agent.app\n"
        # What an agent with Envoy also loads (its standard metrics).
        "import agent.telemetry.aggregator, agent.telemetry.als, agent.telemetry.peers\n"
        "from agent.metrics import AgentMetrics\n"
        "m = AgentMetrics(); m.scrapes.inc()\n"
        "bad = [n for n in sys.modules if n.split('.')[0] in ('prometheus_client', 'wsgiref')"
        " or n in ('http.server', 'urllib.request', 'importlib.metadata')]\n"
        "print(','.join(bad))\n"
        "m.render()\n"
        "print('prometheus_client' in sys.modules)\n"
    )
    out = fresh_lines(code)
    assert out[0] == "", f"imported at start: {out[0]}"
    assert out[1] == "True"  # and a scrape does load it
