"""Telemetry API `metrics`: providers and overrides, from the kind through Istio's merge to
the generated loggers (control plane), and applied to what the agent exports (agent)."""

from __future__ import annotations

from envoy.config.core.v3.base_pb2 import TrafficDirection
from envoy.data.accesslog.v3.accesslog_pb2 import AccessLogType
from envoy.extensions.access_loggers.grpc.v3.als_pb2 import (
    HttpGrpcAccessLogConfig,
    TcpGrpcAccessLogConfig,
)
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)
from envoy.extensions.filters.network.tcp_proxy.v3.tcp_proxy_pb2 import TcpProxy
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.telemetry import overrides
from agent.telemetry.aggregator import MetricsAggregator
from control.config.meshconfig import parse_mesh_config
from control.generate.access_logs import HTTP_GRPC_LOGGER, TCP_GRPC_LOGGER
from control.generate.filters import HCM_FILTER, TCP_PROXY_FILTER
from control.generate.telemetry_metrics import (
    HEADER_MUTATION_FILTER,
    HEADER_TO_METADATA_FILTER,
)
from control.model.index import MeshIndex
from control.model.proxy import Proxy, proxy_from_node
from control.model.telemetry import WorkloadMode
from protos import telemetry as t
from tests.support.traffic import mesh_config
from tests.unit.test_telemetry import APP, filters, listeners, telemetry
from tests.unit.test_telemetry_metrics import PEERS, client_entry, server_entry, tcp_entry

# --- the wire value --------------------------------------------------------------------------


def test_overrides_value_round_trip_and_garbage() -> None:
    value = t.encode_overrides(
        frozenset({"REQUEST_COUNT"}),
        {"REQUEST_DURATION": frozenset({"request_protocol"}), "REQUEST_COUNT": frozenset({"x"})},
    )
    # A disabled metric's removed labels say nothing.
    assert t.decode_overrides(value) == (
        frozenset({"REQUEST_COUNT"}),
        {"REQUEST_DURATION": frozenset({"request_protocol"})},
    )
    assert t.encode_overrides(frozenset(), {}) == ""
    for bad in ("", "{", "[]", '{"disabled": "REQUEST_COUNT"}', '{"removed": {"X": [1]}}'):
        assert t.decode_overrides(bad) is None, bad
    assert t.decode_overrides("[" * (t.MAX_OVERRIDES_VALUE + 1)) is None
    # Names this version does not know are dropped, not fatal.
    assert t.decode_overrides('{"disabled":["FUTURE_METRIC"]}') == (frozenset(), {})


# --- the kind and Istio's merge ---------------------------------------------------------------


def _metrics(*docs: str, mesh: str = "", **labels: str):  # type: ignore[no-untyped-def]
    idx = MeshIndex(mesh_config(*docs), mesh=parse_mesh_config(mesh, "mesh.yaml"))
    from tests.unit.test_telemetry import tel

    return tel(idx, **labels).metrics


def test_overrides_merge_by_level_mode_and_metric_as_istio() -> None:
    m = _metrics(
        telemetry(
            "mesh",
            "istio-system",
            """
            metrics:
            - overrides:
              - match: {metric: ALL_METRICS}
                tagOverrides: {request_protocol: {operation: REMOVE}}
              - match: {metric: REQUEST_SIZE, mode: CLIENT}
                disabled: true
            """,
        ),
        telemetry(
            "web",
            "default",
            """
            metrics:
            - providers: [{name: prometheus}]
              overrides:
              - match: {metric: REQUEST_COUNT, mode: SERVER}
                disabled: true
              - match: {metric: REQUEST_DURATION}
                tagOverrides:
                  request_protocol: {operation: UPSERT, value: "'h'"}
                  response_flags: {operation: REMOVE}
            """,
            "app: web",
        ),
        app="web",
    )
    assert m.prometheus
    server, client = m.side(WorkloadMode.SERVER), m.side(WorkloadMode.CLIENT)
    assert server.disabled == {"REQUEST_COUNT"}
    assert client.disabled == {"REQUEST_SIZE"}
    removed = dict(server.removed)
    # The workload's UPSERT (not applied: unsupported) replaced the mesh's REMOVE for that tag.
    assert removed["REQUEST_DURATION"] == {"response_flags"}
    assert removed["TCP_SENT_BYTES"] == {"request_protocol"}
    assert "REQUEST_COUNT" not in removed  # disabled: nothing to remove
    assert not server.http_off and not server.tcp_off
    assert not m.enabled("REQUEST_COUNT", WorkloadMode.SERVER)
    assert m.enabled("REQUEST_COUNT", WorkloadMode.CLIENT)


def test_providers_decide_whether_there_are_metrics_at_all() -> None:
    mesh = (
        "extensionProviders:\n- {name: prom2, prometheus: {}}\n"
        "- {name: envoy2, envoyFileAccessLog: {}}\n"
    )
    off = telemetry("quiet", "default", "metrics:\n- providers: [{name: envoy2}]", "app: quiet")
    renamed = telemetry("prom", "default", "metrics:\n- providers: [{name: prom2}]", "app: web")
    assert not _metrics(off, renamed, mesh=mesh, app="quiet").prometheus
    assert _metrics(off, renamed, mesh=mesh, app="web").prometheus
    assert _metrics(off, renamed, mesh=mesh, app="other").prometheus  # the default provider
    # An entry for another provider does not override the prometheus metrics.
    other = telemetry(
        "o",
        "default",
        """
        metrics:
        - providers: [{name: envoy2}]
          overrides: [{match: {metric: ALL_METRICS}, disabled: true}]
        - providers: [{name: prometheus}]
        """,
    )
    m = _metrics(other, mesh=mesh)
    assert m.prometheus and m.side(WorkloadMode.SERVER).disabled == frozenset()


def test_upsert_and_custom_metrics_are_reported_not_applied() -> None:
    config = mesh_config(
        telemetry(
            "t",
            "default",
            """
            metrics:
            - overrides:
              - match: {customMetric: my_metric}
                disabled: true
              - tagOverrides: {team: {operation: UPSERT, value: "'payments'"}}
            """,
        )
    )
    messages = [w.message for w in config.warnings]
    assert any("UPSERT is not supported" in m and "ignored" in m for m in messages), messages
    assert any("'my_metric'" in m and "changes nothing" in m for m in messages), messages


# --- generated loggers ---------------------------------------------------------------------


def _proxy(app: str = "backend", ip: str = "127.0.1.5") -> Proxy:
    return proxy_from_node(
        f"sidecar~{ip}~{app}-1.default~default.svc.cluster.local",
        {"LABELS": {"app": app}, "INTERCEPTION_MODE": "NONE", t.ALS_NODE_METADATA: "true"},
    )


def _loggers(doc: str, direction: str) -> dict[str, dict[str, str]]:
    """Per logger name on the listeners of one direction (the backend's inbound ones, a
    client's outbound ones): its literal tags."""
    inbound = direction == "inbound"
    p = _proxy() if inbound else _proxy("client", "127.0.1.6")
    want = TrafficDirection.INBOUND if inbound else TrafficDirection.OUTBOUND
    ls = [x for x in listeners(mesh_config(APP, doc), "", p) if x.traffic_direction == want]
    assert ls
    out: dict[str, dict[str, str]] = {}
    for _, typed in filters(ls, HCM_FILTER):
        hcm = HttpConnectionManager()
        assert typed.Unpack(hcm)
        _no_peer_metadata(hcm, inbound=inbound)
        for log in hcm.access_log:
            if log.name == HTTP_GRPC_LOGGER:
                http = HttpGrpcAccessLogConfig()
                assert log.typed_config.Unpack(http)
                out[log.name] = {c.tag: c.literal.value for c in http.common_config.custom_tags}
    for _, typed in filters(ls, TCP_PROXY_FILTER):
        proxy = TcpProxy()
        assert typed.Unpack(proxy)
        for log in proxy.access_log:
            if log.name == TCP_GRPC_LOGGER:
                tcp = TcpGrpcAccessLogConfig()
                assert log.typed_config.Unpack(tcp)
                out[log.name] = {c.tag: c.literal.value for c in tcp.common_config.custom_tags}
    return out


def _no_peer_metadata(hcm: HttpConnectionManager, *, inbound: bool) -> None:
    """No peer metadata is sent or read (the agents name peers from the control plane's
    table): no early header mutation, and no filter on the server side. A client on the ALS
    path has the two that carry its upstream's certificate into metadata (response only)."""
    from envoy.extensions.filters.http.header_mutation.v3.header_mutation_pb2 import (
        HeaderMutation,
    )

    assert not hcm.early_header_mutation_extensions
    names = [f.name for f in hcm.http_filters]
    if inbound or HEADER_TO_METADATA_FILTER not in names:
        assert HEADER_TO_METADATA_FILTER not in names and HEADER_MUTATION_FILTER not in names
        return
    mutation = HeaderMutation()
    hcm.http_filters[names.index(HEADER_MUTATION_FILTER)].typed_config.Unpack(mutation)
    assert not mutation.mutations.request_mutations
    touched = {m.remove or m.append.header.key for m in mutation.mutations.response_mutations}
    assert touched == {t.UPSTREAM_PEER_HEADER}


def test_loggers_carry_the_sides_overrides() -> None:
    doc = telemetry(
        "t",
        "default",
        """
        metrics:
        - overrides:
          - match: {metric: REQUEST_COUNT, mode: SERVER}
            disabled: true
          - tagOverrides: {request_protocol: {operation: REMOVE}}
        """,
    )
    inbound = _loggers(doc, "inbound")
    assert set(inbound) == {HTTP_GRPC_LOGGER, TCP_GRPC_LOGGER}
    disabled, removed = t.decode_overrides(inbound[HTTP_GRPC_LOGGER][t.TAG_OVERRIDES]) or ((), {})
    assert disabled == {"REQUEST_COUNT"}
    assert removed["REQUEST_DURATION"] == {"request_protocol"}
    outbound = _loggers(doc, "outbound")
    disabled, removed = t.decode_overrides(outbound[HTTP_GRPC_LOGGER][t.TAG_OVERRIDES]) or ((), {})
    assert disabled == frozenset() and removed["REQUEST_COUNT"] == {"request_protocol"}
    # Without overrides, no tag at all.
    assert t.TAG_OVERRIDES not in _loggers("", "inbound")[HTTP_GRPC_LOGGER]


def test_no_logger_where_nothing_would_be_exported() -> None:
    all_http_off = telemetry(
        "t",
        "default",
        """
        metrics:
        - overrides:
          - match: {metric: ALL_METRICS, mode: SERVER}
            disabled: true
          - match: {metric: TCP_SENT_BYTES, mode: SERVER}
            disabled: false
        """,
    )
    assert set(_loggers(all_http_off, "inbound")) == {TCP_GRPC_LOGGER}
    assert set(_loggers(all_http_off, "outbound")) == {HTTP_GRPC_LOGGER, TCP_GRPC_LOGGER}
    mesh_off = telemetry(
        "nometrics", "istio-system", "metrics:\n- providers: [{name: envoy}]"
    )  # envoy is a file logger, not a metrics provider
    assert _loggers(mesh_off, "inbound") == {} and _loggers(mesh_off, "outbound") == {}


def test_a_side_without_an_http_logger_has_no_telemetry_filter() -> None:
    """Its peers name it from the control plane's table, so nothing is sent for them."""
    mesh_off = telemetry("nometrics", "istio-system", "metrics:\n- providers: [{name: envoy}]")
    for direction, p in (("inbound", _proxy()), ("outbound", _proxy("client", "127.0.1.6"))):
        want = TrafficDirection.INBOUND if direction == "inbound" else TrafficDirection.OUTBOUND
        ls = [
            x for x in listeners(mesh_config(APP, mesh_off), "", p) if x.traffic_direction == want
        ]
        hcms = []
        for _, typed in filters(ls, HCM_FILTER):
            hcm = HttpConnectionManager()
            assert typed.Unpack(hcm)
            hcms.append(hcm)
        assert hcms, direction
        for hcm in hcms:
            assert not hcm.early_header_mutation_extensions, direction
            names = [f.name for f in hcm.http_filters]
            assert HEADER_TO_METADATA_FILTER not in names, direction
            assert HEADER_MUTATION_FILTER not in names, direction
            assert not hcm.access_log, direction


# --- the agent -------------------------------------------------------------------------------


def _tagged(entry, disabled=(), **removed):  # type: ignore[no-untyped-def]
    value = t.encode_overrides(
        frozenset(disabled), {m: frozenset(v.split(",")) for m, v in removed.items()}
    )
    if value:
        entry.common_properties.custom_tags[t.TAG_OVERRIDES] = value
    return entry


def _scrape(agg: MetricsAggregator) -> dict[str, list[dict[str, str | float]]]:
    registry = CollectorRegistry()
    registry.register(agg)
    out: dict[str, list[dict[str, str | float]]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append({**s.labels, "_value": s.value})
    return out


def test_a_disabled_metric_is_not_exported_for_its_side_only() -> None:
    agg = MetricsAggregator()
    agg.record_http(_tagged(server_entry(), ["REQUEST_COUNT"]))
    agg.record_http(client_entry())
    got = _scrape(agg)
    assert [s["reporter"] for s in got["istio_requests_total"]] == ["source"]
    counts = got["istio_request_duration_milliseconds_count"]
    assert sorted(str(s["reporter"]) for s in counts) == ["destination", "source"]


def test_removed_labels_are_gone_and_their_series_summed() -> None:
    agg = MetricsAggregator(peers=PEERS)
    # Only the response code differs; REQUEST_COUNT drops it, the histograms keep it.
    for code in (200, 200, 503):
        agg.record_http(_tagged(server_entry(code=code), REQUEST_COUNT="response_code"))
    got = _scrape(agg)
    (requests,) = got["istio_requests_total"]
    assert "response_code" not in requests and requests["_value"] == 3
    assert requests["reporter"] == "destination" and requests["source_workload"] == "client"
    counts = {s["response_code"]: s["_value"] for s in got["istio_request_bytes_count"]}
    assert counts == {"200": 2, "503": 1}
    # Buckets are summed too, and stay cumulative.
    buckets = [s for s in got["istio_request_duration_milliseconds_bucket"]]
    assert {s["response_code"] for s in buckets} == {"200", "503"}
    assert len(agg.http) == 2  # recorded in full: a histogram still needs the code


def test_a_label_every_metric_drops_is_not_even_recorded() -> None:
    agg = MetricsAggregator(max_series=3)
    every = {m: "response_code" for m in t.HTTP_METRICS}
    for code in range(200, 210):
        agg.record_http(_tagged(server_entry(code=code), **every))
    assert len(agg.http) == 1 and agg.overflow == 0
    got = _scrape(agg)
    (requests,) = got["istio_requests_total"]
    assert requests["_value"] == 10 and "response_code" not in requests


def test_tcp_overrides_and_a_family_switched_off() -> None:
    agg = MetricsAggregator()
    off = _tagged(tcp_entry("s1", AccessLogType.TcpConnectionEnd, 10, 20), list(t.TCP_METRICS))
    agg.record_tcp(off)
    assert agg.tcp == {}  # nothing recorded for a family with every metric disabled
    agg.record_tcp(
        _tagged(tcp_entry("s2", AccessLogType.TcpConnectionEnd, 10, 20), ["TCP_SENT_BYTES"])
    )
    got = _scrape(agg)
    assert "istio_tcp_sent_bytes_total" not in got
    assert len(got["istio_tcp_received_bytes_total"]) == 1


def test_the_latest_overrides_of_a_reporter_apply_to_earlier_counts() -> None:
    agg = MetricsAggregator()
    agg.record_http(server_entry())
    agg.record_http(_tagged(server_entry(), ["REQUEST_COUNT"]))
    assert "istio_requests_total" not in _scrape(agg)
    agg.record_http(server_entry())  # the Telemetry was deleted: the override with it
    (requests,) = _scrape(agg)["istio_requests_total"]
    assert requests["_value"] == 3


def test_a_malformed_tag_means_no_overrides() -> None:
    entry = server_entry()
    entry.common_properties.custom_tags[t.TAG_OVERRIDES] = "{not json"
    assert overrides.of_entry(entry.common_properties) is overrides.NO_OVERRIDES
    agg = MetricsAggregator()
    agg.record_http(entry)
    assert _scrape(agg)["istio_requests_total"][0]["_value"] == 1
