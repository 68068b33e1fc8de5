"""The control plane's metric rendering, without sockets: Istio's exposition of counters
(control/promtext.py), the event-loop histogram against prometheus_client's own,
and the event-loop counter against prometheus_client's Counter (control/loopmetrics.py), and
Istio's label spellings (control/metrics.py)."""

from __future__ import annotations

import grpc
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from control.loopmetrics import LoopCounter, LoopHistogram
from control.metrics import grpc_code_name, metric_type, trigger
from control.promtext import istio_exposition
from protos import typeurls
from tests.support.promtext import parse

BUCKETS = (0.01, 0.1, 1, 3)
VALUES = (0.0, 0.01, 0.05, 0.1, 2.5, 3.0, 7.0)  # bounds themselves, and above all of them


def test_loop_histogram_renders_as_prometheus_client_does() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    a = LoopHistogram("h", "doc", ["type"], buckets=BUCKETS, registry=ours)
    b = Histogram("h", "doc", ["type"], buckets=BUCKETS, registry=theirs)
    plain_a = LoopHistogram("p", "doc", buckets=BUCKETS, registry=ours)
    Histogram("p", "doc", buckets=BUCKETS, registry=theirs)  # never observed: zeros
    for i, v in enumerate(VALUES):
        for kind in ("cds", "eds") if i % 2 else ("cds",):
            a.labels(kind).observe(v)
            b.labels(kind).observe(v)
    del plain_a
    mine = parse(generate_latest(ours).decode()).samples
    reference = {
        k: v
        for k, v in parse(generate_latest(theirs).decode()).samples.items()
        if "_created" not in k[0]
    }
    assert mine == reference
    assert ours.get_sample_value("h_bucket", {"type": "cds", "le": "0.01"}) == 2
    assert ours.get_sample_value("h_bucket", {"type": "cds", "le": "+Inf"}) == len(VALUES)


def test_loop_counter_renders_as_prometheus_client_does() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    a = LoopCounter("c", "doc", ["type"], registry=ours)
    b = Counter("c", "doc", ["type"], registry=theirs)
    plain_a = LoopCounter("p_total", "doc", registry=ours)  # named with the suffix, as allowed
    plain_b = Counter("p_total", "doc", registry=theirs)
    for i in range(7):
        for kind in ("cds", "eds") if i % 2 else ("cds",):
            a.labels(kind).inc()
            b.labels(kind).inc()
    plain_a.inc(2.5)
    plain_b.inc(2.5)
    LoopCounter("never", "no children yet", ["type"], registry=ours)
    Counter("never", "no children yet", ["type"], registry=theirs)

    def samples(r: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        return {
            k: v
            for k, v in parse(generate_latest(r).decode()).samples.items()
            if "_created" not in k[0]
        }

    assert samples(ours) == samples(theirs)
    assert ours.get_sample_value("c_total", {"type": "cds"}) == 7
    assert ours.get_sample_value("p_total") == 2.5
    # As istiod renders it: the bare name, typed counter.
    m = parse(istio_exposition(ours).decode())
    assert m.value("c", type="eds") == 3 and m.types["c"] == "counter"
    assert m.types["never"] == "counter" and m.series("never") == []
    with pytest.raises(ValueError):
        a.labels("cds").inc(-1)


def test_counters_render_under_their_istio_names() -> None:
    r = CollectorRegistry()
    Counter("pilot_xds_pushes", "pushes", ["type"], registry=r).labels("cds").inc(3)
    Counter("sidecar_injection_requests_total", "requests", registry=r).inc()
    Counter("never_moved", "labelled, no children yet", ["type"], registry=r)
    Gauge("pilot_services", "services", registry=r).set(2)
    Histogram("pilot_debounce_time", "debounce", buckets=(1,), registry=r).observe(0.5)
    m = parse(istio_exposition(r).decode())
    assert m.value("pilot_xds_pushes", type="cds") == 3
    assert m.types["pilot_xds_pushes"] == "counter"
    # Istio's own name ends in _total: kept.
    assert m.value("sidecar_injection_requests_total") == 1
    assert m.types["sidecar_injection_requests_total"] == "counter"
    # A family with no series yet still announces its type (dashboards' names exist).
    assert m.types["never_moved"] == "counter" and m.series("never_moved") == []
    assert m.value("pilot_services") == 2
    assert m.value("pilot_debounce_time_count") == 1
    assert not [n for n in m.names() if n.endswith("_created")]
    assert "pilot_xds_pushes_total" not in m.names()


def test_istio_label_spellings() -> None:
    assert [metric_type(t) for t in (typeurls.CLUSTER, typeurls.ENDPOINT)] == ["cds", "eds"]
    assert [metric_type(t) for t in (typeurls.LISTENER, typeurls.ROUTE)] == ["lds", "rds"]
    assert metric_type(typeurls.NAME_TABLE) == "nds"
    # Types Istio has no short name for are labelled by their URL, as istiod does.
    assert metric_type(typeurls.DEBUG_SYNCZ) == typeurls.DEBUG_SYNCZ
    assert [trigger(r) for r in ("config", "registry", "manual")] == ["config", "endpoint", "debug"]
    assert grpc_code_name(grpc.StatusCode.INVALID_ARGUMENT.value[0]) == "InvalidArgument"
    assert grpc_code_name(grpc.StatusCode.INTERNAL.value[0]) == "Internal"
    assert grpc_code_name(grpc.StatusCode.CANCELLED.value[0]) == "Canceled"  # Go's spelling
    assert grpc_code_name(grpc.StatusCode.OK.value[0]) == "OK"
    assert grpc_code_name(99) == "Code(99)"
