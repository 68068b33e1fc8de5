"""The dashboard's data: Prometheus text parsing, histogram quantiles, the graph builder
(rates, error rate, p99, mTLS, reporter choice) and the snapshot history."""

from __future__ import annotations

import math

import pytest

from control.ui.graph import build_graph, flow_rates
from control.ui.history import SnapshotHistory
from control.ui.promapi import PrometheusError, snapshot_from_vector
from control.ui.promtext import PromTextError, parse_samples
from control.ui.quantile import histogram_quantile
from control.ui.samples import Sample, Snapshot, TargetSamples, sample

BOUNDS = ("1", "5", "10", "25", "50", "100", "250", "+Inf")


def _flow(
    reporter: str = "destination",
    src: str = "client",
    dst: str = "backend",
    code: str = "200",
    security: str = "mutual_tls",
) -> dict[str, str]:
    return {
        "reporter": reporter,
        "source_workload": src,
        "source_workload_namespace": "default",
        "source_app": src,
        "destination_workload": dst,
        "destination_workload_namespace": "default",
        "destination_service": f"{dst}.default.svc.cluster.local",
        "destination_service_name": dst,
        "destination_service_namespace": "default",
        "request_protocol": "http",
        "response_code": code,
        "connection_security_policy": security,
    }


def _requests(count: float, **flow: str) -> Sample:
    return sample("istio_requests_total", _flow(**flow), count)


def _buckets(counts: dict[str, float], **flow: str) -> list[Sample]:
    labels = {k: v for k, v in _flow(**flow).items() if k != "response_code"}
    return [
        sample("istio_request_duration_milliseconds_bucket", {**labels, "le": le}, counts[le])
        for le in BOUNDS
    ]


def _snap(at: float, *samples: Sample, target: str = "10.0.0.2:15020") -> Snapshot:
    return Snapshot(at, {target: TargetSamples.of(at, samples)})


def test_parse_keeps_only_istio_series_and_reads_escapes_and_histograms() -> None:
    text = (
        "# HELP envoy_cluster_upstream_rq_total x\n"
        "# TYPE envoy_cluster_upstream_rq_total counter\n"
        'envoy_cluster_upstream_rq_total{envoy_cluster_name="a"} 7\n'
        "# TYPE istio_requests_total counter\n"
        'istio_requests_total{reporter="destination",source_workload="a\\"b",'
        'response_code="200"} 12 1700000000000\n'
        "# TYPE istio_request_duration_milliseconds histogram\n"
        'istio_request_duration_milliseconds_bucket{le="10"} 3\n'
        'istio_request_duration_milliseconds_bucket{le="+Inf"} 4\n'
        "istio_request_duration_milliseconds_sum 40\n"
        "istio_request_duration_milliseconds_count 4\n"
        'istio_tcp_sent_bytes_total{reporter="source"} NaN\n'
    )
    samples = parse_samples(text)
    assert [(s.name, s.value) for s in samples] == [
        ("istio_requests_total", 12.0),
        ("istio_request_duration_milliseconds_bucket", 3.0),
        ("istio_request_duration_milliseconds_bucket", 4.0),
    ]
    assert samples[0].label("source_workload") == 'a"b'
    assert samples[2].label("le") == "+Inf"


def test_parse_error_is_one_line() -> None:
    with pytest.raises(PromTextError, match="bad Prometheus text"):
        parse_samples('istio_requests_total{reporter="x" 12\n')


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = {1.0: 0.0, 5.0: 10.0, 10.0: 10.0, math.inf: 10.0}
    # rank 5 of 10 falls in (1, 5]: 1 + 4 * 5/10
    assert histogram_quantile(0.5, buckets) == pytest.approx(3.0)
    assert histogram_quantile(0.99, {10.0: 50.0, 100.0: 100.0, math.inf: 100.0}) == (
        pytest.approx(10 + 90 * 49 / 50)
    )
    # Past every finite bound: the highest finite one.
    assert histogram_quantile(0.99, {10.0: 1.0, math.inf: 10.0}) == 10.0
    assert histogram_quantile(0.5, {10.0: 0.0, math.inf: 0.0}) is None
    assert histogram_quantile(0.5, {10.0: 3.0}) is None


def test_request_rate_error_rate_and_mtls_between_two_snapshots() -> None:
    old = _snap(100.0, _requests(1000, code="200"), _requests(10, code="503"))
    new = _snap(110.0, _requests(1100, code="200"), _requests(110, code="503"))
    graph = build_graph(old, new)
    assert graph.interval == 10.0
    ids = {n.id for n in graph.nodes}
    assert ids == {
        "wl:default/client",
        "svc:backend.default.svc.cluster.local",
        "wl:default/backend",
    }
    edge = graph.edge("wl:default/client>svc:backend.default.svc.cluster.local")
    assert edge is not None
    assert edge.rps == pytest.approx(20.0)
    assert edge.error_rate == pytest.approx(0.5)
    assert edge.codes == {"200": pytest.approx(10.0), "503": pytest.approx(10.0)}
    assert edge.mtls is True and edge.reporter == "destination"
    served = graph.edge("svc:backend.default.svc.cluster.local>wl:default/backend")
    assert served is not None and served.rps == pytest.approx(20.0)


def test_plaintext_traffic_is_not_mtls_and_a_mix_is_partial() -> None:
    old = _snap(0.0, _requests(0, security="none"), _requests(0, code="201"))
    new = _snap(10.0, _requests(30, security="none"), _requests(10, code="201"))
    edge = build_graph(old, new).edges[0]
    assert edge.mtls is False
    assert edge.mtls_share == pytest.approx(0.25)
    plain = build_graph(
        _snap(0.0, _requests(0, security="none")), _snap(10.0, _requests(30, security="none"))
    ).edges[0]
    assert plain.mtls_share == 0.0 and plain.mtls is False


def test_p99_from_bucket_increases_not_totals() -> None:
    # Before: 1000 slow requests (all in (100, 250]); in the window: 100 fast ones in (5, 10].
    before = dict.fromkeys(BOUNDS, 0.0) | {"250": 1000.0, "+Inf": 1000.0}
    after = {le: before[le] + (100.0 if float(le) >= 10 else 0.0) for le in BOUNDS}
    old = _snap(0.0, _requests(1000), *_buckets(before))
    new = _snap(10.0, _requests(1100), *_buckets(after))
    edge = build_graph(old, new).edges[0]
    assert edge.latency_ms["p99"] == pytest.approx(5 + 5 * 99 / 100)
    assert edge.latency_ms["p50"] == pytest.approx(7.5)


def test_caller_report_counts_and_server_report_says_mtls() -> None:
    # An injected fault: the caller's proxy answers half the requests with 503 itself, so
    # the server never sees them (its report has only the 200s).
    caller = {"reporter": "source", "security": "unknown"}
    old = _snap(
        0.0,
        _requests(0, **caller),
        _requests(0, code="503", **caller),
        _requests(0, reporter="destination"),
        _requests(0, dst="legacy", **caller),
    )
    new = _snap(
        10.0,
        _requests(100, **caller),
        _requests(100, code="503", **caller),
        _requests(100, reporter="destination"),
        _requests(50, dst="legacy", **caller),
    )
    graph = build_graph(old, new)
    backend = graph.edge("wl:default/client>svc:backend.default.svc.cluster.local")
    assert backend is not None and backend.reporter == "source"
    assert backend.rps == pytest.approx(20.0)  # the caller's count, not both added up
    assert backend.error_rate == pytest.approx(0.5)
    assert backend.mtls is True  # from the server's report
    legacy = graph.edge("wl:default/client>svc:legacy.default.svc.cluster.local")
    assert legacy is not None and legacy.reporter == "source"
    assert legacy.rps == pytest.approx(5.0) and legacy.mtls is None


def test_server_report_stands_in_for_callers_without_sidecar() -> None:
    old = _snap(0.0, _requests(0, src="unknown", security="none"))
    new = _snap(10.0, _requests(70, src="unknown", security="none"))
    edge = build_graph(old, new).edge("unknown>svc:backend.default.svc.cluster.local")
    assert edge is not None and edge.reporter == "destination"
    assert edge.rps == pytest.approx(7.0) and edge.mtls is False


def test_counter_reset_new_series_and_new_targets() -> None:
    old = _snap(0.0, _requests(500))
    # The agent restarted (counter 500 -> 40) and a new series appeared since.
    new = _snap(10.0, _requests(40), _requests(20, code="500"))
    edge = build_graph(old, new).edges[0]
    assert edge.rps == pytest.approx(6.0)
    assert edge.error_rate == pytest.approx(2 / 6)
    # A target that was not read at the start says nothing about the window.
    late = Snapshot(10.0, {"10.0.0.9:15020": TargetSamples.of(10.0, (_requests(999),))})
    assert list(flow_rates(old, late)) == []


def test_idle_series_make_no_edge_and_tcp_makes_one() -> None:
    tcp = {k: v for k, v in _flow().items() if k not in ("response_code", "request_protocol")}
    old = _snap(0.0, _requests(5), sample("istio_tcp_sent_bytes_total", tcp, 0))
    new = _snap(
        10.0,
        _requests(5),
        sample("istio_tcp_sent_bytes_total", tcp, 10_000),
        sample("istio_tcp_received_bytes_total", tcp, 500),
    )
    edges = build_graph(old, new).edges
    assert len(edges) == 2
    assert edges[0].protocol == "tcp"
    assert edges[0].tcp_sent_bps == pytest.approx(1000.0)
    assert edges[0].tcp_received_bps == pytest.approx(50.0)
    assert edges[0].rps == 0 and edges[0].error_rate is None and edges[0].mtls is True


def test_unknown_source_and_hostile_names_stay_data() -> None:
    hostile = "<img src=x onerror=alert(1)>"
    old = _snap(0.0, _requests(0, src="unknown"), _requests(0, src=hostile))
    new = _snap(1.0, _requests(3, src="unknown"), _requests(3, src=hostile))
    graph = build_graph(old, new)
    kinds = {n.id: n.kind for n in graph.nodes}
    assert kinds["unknown"] == "unknown"
    assert kinds[f"wl:default/{hostile}"] == "workload"
    assert graph.as_json()["namespaces"] == ["default"]


def test_history_thins_old_snapshots_and_finds_windows() -> None:
    history = SnapshotHistory(horizon=600.0)
    for i in range(0, 1200, 2):
        history.add(Snapshot(float(i)))
    assert len(history) < 80  # 600 scrapes, kept about log-spaced
    latest = history.latest
    assert latest is not None and latest.at == 1198.0
    window = history.window(10.0)
    assert window is not None and window[1].at - window[0].at == pytest.approx(10.0)
    start, _ = history.window(300.0) or (None, None)
    assert start is not None and 300.0 <= 1198.0 - start.at <= 300.0 * 1.25
    oldest, _ = history.window(10_000.0) or (None, None)
    assert oldest is not None and 1198.0 - oldest.at >= 598.0


def test_history_needs_two_snapshots() -> None:
    history = SnapshotHistory()
    assert history.window(10) is None
    history.add(Snapshot(5.0))
    history.add(Snapshot(4.0))  # older than the latest: ignored
    assert history.window(10) is None
    history.add(Snapshot(7.0))
    assert history.window(10) is not None


def test_prometheus_vector_answer_becomes_a_snapshot() -> None:
    answer = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {
                    "metric": {
                        "__name__": "istio_requests_total",
                        "instance": "a:15020",
                        **_flow(),
                    },
                    "value": [1700000000.0, "12"],
                },
                {"metric": {"__name__": "up", "instance": "a:15020"}, "value": [0, "1"]},
            ],
        },
    }
    snap = snapshot_from_vector(answer, 5.0)
    assert list(snap.targets) == ["a:15020"]
    [flow] = snap.targets["a:15020"].flows.values()
    assert flow.codes == {"200": 12.0}
    with pytest.raises(PrometheusError, match="bad query"):
        snapshot_from_vector({"status": "error", "error": "bad query"}, 0.0)
