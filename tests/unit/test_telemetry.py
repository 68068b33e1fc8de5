"""The Telemetry kind, Istio's precedence (workload > namespace > mesh) and merge rules, and
the access logs and tracers they put on generated listeners."""

from __future__ import annotations

import textwrap

import pytest
from envoy.config.accesslog.v3.accesslog_pb2 import ComparisonFilter
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.trace.v3.opentelemetry_pb2 import OpenTelemetryConfig
from envoy.config.trace.v3.zipkin_pb2 import ZipkinConfig
from envoy.extensions.access_loggers.file.v3.file_pb2 import FileAccessLog
from envoy.extensions.access_loggers.stream.v3.stream_pb2 import StdoutAccessLog
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)
from envoy.extensions.filters.network.tcp_proxy.v3.tcp_proxy_pb2 import TcpProxy
from google.protobuf import any_pb2

from control.config.errors import ConfigError
from control.config.kinds.telemetry import parse_code_filter
from control.config.meshconfig import parse_mesh_config
from control.generate import GENERATORS
from control.generate.access_logs import ISTIO_JSON_LABELS, ISTIO_TEXT_FORMAT
from control.generate.context import GenContext
from control.generate.filters import HCM_FILTER, TCP_PROXY_FILTER
from control.generate.resource_names import CLUSTER_TYPE, LISTENER_TYPE
from control.model.index import MeshIndex
from control.model.meshconfig import AccessLogEncoding, MeshSettings, ZipkinProvider
from control.model.proxy import Proxy, proxy_from_node
from control.model.telemetry import CustomTagKind, WorkloadMode
from control.model.types import MeshConfig, labels_of
from control.xds.cache import ResourceCache
from tests.support.traffic import mesh_config

TEL = "apiVersion: telemetry.istio.io/v1\nkind: Telemetry\n"


def telemetry(name: str, namespace: str, spec: str, selector: str = "") -> str:
    sel = f"  selector: {{matchLabels: {{{selector}}}}}\n" if selector else ""
    body = textwrap.indent(textwrap.dedent(spec).strip("\n"), "  ")
    return f"---\n{TEL}metadata: {{name: {name}, namespace: {namespace}}}\nspec:\n{sel}{body}\n"


def index(config: MeshConfig, mesh: str = "") -> MeshIndex:
    return MeshIndex(config, mesh=parse_mesh_config(mesh, "mesh.yaml"))


def tel(idx: MeshIndex, namespace: str = "default", **labels: str):  # type: ignore[no-untyped-def]
    return idx._telemetry.for_workload(namespace, labels_of(labels))


# --- the kind -------------------------------------------------------------------------------


def test_telemetry_kind_parses_every_section() -> None:
    config = mesh_config(
        telemetry(
            "t",
            "default",
            """
            accessLogging:
            - providers: [{name: envoy}]
              filter: {expression: "response.code >= 400"}
              match: {mode: SERVER}
            tracing:
            - providers: [{name: zipkin}]
              randomSamplingPercentage: 50
              disableSpanReporting: false
              customTags:
                team: {literal: {value: payments}}
                user: {header: {name: x-user, defaultValue: anon}}
                pod: {environment: {name: POD_NAME}}
            metrics:
            - providers: [{name: prometheus}]
              overrides:
              - match: {metric: REQUEST_COUNT, mode: CLIENT}
                tagOverrides:
                  request_protocol: {operation: REMOVE}
              - match: {metric: TCP_OPENED_CONNECTIONS}
                disabled: true
            """,
            selector="app: web",
        )
    )
    (t,) = config.telemetries
    assert t.selector == (("app", "web"),)
    (log,) = t.access_logging
    assert log.providers == ("envoy",) and log.mode is WorkloadMode.SERVER
    assert log.filter is not None and log.filter.terms == ((">=", 400),)
    (tr,) = t.tracing
    assert tr.random_sampling_percentage == 50.0 and tr.disable_span_reporting is False
    assert {(c.tag, c.kind, c.value, c.default) for c in tr.custom_tags} == {
        ("team", CustomTagKind.LITERAL, "payments", ""),
        ("user", CustomTagKind.HEADER, "x-user", "anon"),
        ("pod", CustomTagKind.ENVIRONMENT, "POD_NAME", ""),
    }
    (m,) = t.metrics
    assert m.overrides[0].tag_overrides[0].operation == "REMOVE"
    assert m.overrides[1].disabled is True


def test_v1alpha1_is_accepted() -> None:
    text = telemetry("t", "default", "tracing: [{randomSamplingPercentage: 10}]")
    text = text.replace("telemetry.istio.io/v1", "telemetry.istio.io/v1alpha1")
    assert mesh_config(text).telemetries[0].tracing[0].random_sampling_percentage == 10.0


@pytest.mark.parametrize(
    ("expression", "codes_logged"),
    [
        ("response.code >= 400", {400, 404, 500, 503}),
        ("response.code >= 500", {500, 503}),
        ("response.code == 503", {503}),
        ("response.code != 200", {0, 201, 400, 404, 500, 503}),
        ("response.code > 499", {500, 503}),
        ("response.code < 300", {0, 200, 201}),
        ("response.code >= 400 && response.code < 500", {400, 404}),
        ("response.code == 404 || response.code == 503", {404, 503}),
    ],
)
def test_common_filter_expressions_compile(expression: str, codes_logged: set[int]) -> None:
    f = parse_code_filter(expression)
    assert f is not None
    codes = {0, 200, 201, 400, 404, 500, 503}
    assert {c for c in codes if f.matches(c)} == codes_logged


@pytest.mark.parametrize(
    "expression",
    [
        "response.duration > duration('1s')",
        "request.headers['x'] == 'y'",
        "response.code >= 400 && response.code < 500 || response.code == 200",
        "response.code >= 'a'",
    ],
)
def test_other_expressions_are_reported_and_the_entry_ignored(expression: str) -> None:
    config = mesh_config(
        telemetry(
            "t",
            "default",
            "accessLogging:\n- providers: [{name: envoy}]\n"
            f'  filter: {{expression: "{expression}"}}',
        )
    )
    assert config.telemetries[0].access_logging == ()
    assert any("is not supported" in w.message and "ignored" in w.message for w in config.warnings)


def test_bad_values_are_errors() -> None:
    with pytest.raises(ConfigError, match="randomSamplingPercentage: must be a number 0-100"):
        mesh_config(telemetry("t", "default", "tracing: [{randomSamplingPercentage: 101}]"))
    with pytest.raises(ConfigError, match=r"match\.mode: must be one of"):
        mesh_config(telemetry("t", "default", "accessLogging: [{match: {mode: BOTH}}]"))


# --- precedence and merging -----------------------------------------------------------------


def test_workload_over_namespace_over_mesh() -> None:
    config = mesh_config(
        telemetry("mesh", "istio-system", "tracing: [{randomSamplingPercentage: 1}]"),
        telemetry("ns", "default", "tracing: [{randomSamplingPercentage: 20}]"),
        telemetry("web", "default", "tracing: [{randomSamplingPercentage: 70}]", "app: web"),
    )
    mesh = """
extensionProviders:
- name: zipkin
  zipkin: {service: 127.0.0.9, port: 9411}
defaultProviders: {tracing: [zipkin]}
"""
    idx = index(config, mesh)
    assert tel(idx, app="web").client.tracing.sampling == 70.0
    assert tel(idx, app="other").client.tracing.sampling == 20.0
    assert tel(idx, "shop", app="web").client.tracing.sampling == 1.0
    # Levels are the three objects, lowest precedence first.
    assert [t.name for t in idx._telemetry.levels("default", labels_of({"app": "web"}))] == [
        "mesh",
        "ns",
        "web",
    ]


def test_tracing_without_telemetry_needs_a_default_provider_and_enable_tracing() -> None:
    mesh = """
defaultConfig: {tracing: {sampling: 33}}
extensionProviders:
- name: zipkin
  zipkin: {service: 127.0.0.9, port: 9411}
defaultProviders: {tracing: [zipkin]}
"""
    on = tel(index(MeshConfig(), mesh))
    assert on.client.tracing is not None and on.client.tracing.sampling == 33.0
    assert on.client.tracing.provider == ZipkinProvider("127.0.0.9", 9411)
    assert tel(index(MeshConfig(), mesh + "enableTracing: false\n")).client.tracing is None
    assert tel(index(MeshConfig(), "")).client.tracing is None


def test_disable_span_reporting_and_custom_tags_merge() -> None:
    mesh = "extensionProviders:\n- name: z\n  zipkin: {service: 127.0.0.9, port: 9411}\n"
    config = mesh_config(
        telemetry(
            "mesh",
            "istio-system",
            """
            tracing:
            - providers: [{name: z}]
              customTags:
                a: {literal: {value: mesh}}
                b: {literal: {value: mesh}}
            """,
        ),
        telemetry(
            "web", "default", "tracing:\n- customTags: {b: {literal: {value: web}}}", "app: web"
        ),
        telemetry("quiet", "default", "tracing: [{disableSpanReporting: true}]", "app: quiet"),
    )
    idx = index(config, mesh)
    web = tel(idx, app="web").client.tracing
    assert web is not None and {(t.tag, t.value) for t in web.custom_tags} == {
        ("a", "mesh"),
        ("b", "web"),
    }
    assert tel(idx, app="quiet").client.tracing is None


def test_access_log_legacy_mesh_config_and_telemetry_disable() -> None:
    config = mesh_config(
        telemetry("silence", "default", "accessLogging: [{disabled: true}]", "app: quiet")
    )
    idx = index(config, "accessLogFile: /tmp/a.log\naccessLogEncoding: JSON\n")
    (sink,) = tel(idx, app="web").client.access_logs
    assert sink.path == "/tmp/a.log" and sink.encoding is AccessLogEncoding.JSON
    assert tel(idx, app="web").server.access_logs == (sink,)
    # disabled: true on one workload silences it, on both sides.
    assert tel(idx, app="quiet").client.access_logs == ()
    assert tel(idx, app="quiet").server.access_logs == ()
    # No access log at all without accessLogFile or a Telemetry.
    assert tel(index(MeshConfig()), app="web").client.access_logs == ()


def test_access_log_providers_filter_and_modes() -> None:
    config = mesh_config(
        telemetry(
            "mesh",
            "istio-system",
            """
            accessLogging:
            - providers: [{name: envoy}]
            """,
        ),
        telemetry(
            "errors",
            "default",
            """
            accessLogging:
            - filter: {expression: "response.code >= 400"}
            """,
        ),
        telemetry(
            "server-only",
            "default",
            "accessLogging:\n- match: {mode: CLIENT}\n  disabled: true",
            "app: api",
        ),
    )
    idx = index(config)
    (mesh_wide,) = tel(idx, "shop").client.access_logs
    assert mesh_wide.path == "/dev/stdout" and mesh_wide.filter is None
    assert mesh_wide.encoding is AccessLogEncoding.TEXT and mesh_wide.text_format == ""
    (errors,) = tel(idx, app="web").client.access_logs
    assert errors.filter is not None and errors.filter.terms == ((">=", 400),)
    api = tel(idx, app="api")
    assert api.client.access_logs == ()
    assert [s.provider for s in api.server.access_logs] == ["envoy"]


def test_metrics_settings_for_the_metrics_code() -> None:
    config = mesh_config(
        telemetry(
            "mesh",
            "istio-system",
            """
            metrics:
            - providers: [{name: prometheus}]
              overrides:
              - match: {metric: REQUEST_COUNT}
                disabled: true
            """,
        ),
        telemetry(
            "web",
            "default",
            """
            metrics:
            - overrides:
              - match: {metric: REQUEST_COUNT, mode: SERVER}
                disabled: false
            """,
            "app: web",
        ),
    )
    m = tel(index(config), app="web").metrics
    assert m.providers == ("prometheus",)
    assert not m.enabled("REQUEST_COUNT", WorkloadMode.CLIENT)
    assert m.enabled("REQUEST_COUNT", WorkloadMode.SERVER)
    assert m.enabled("REQUEST_DURATION", WorkloadMode.CLIENT)
    assert not tel(index(config), app="other").metrics.enabled("REQUEST_COUNT", WorkloadMode.SERVER)


# --- generated config ------------------------------------------------------------------------

APP = textwrap.dedent(
    """\
    apiVersion: v1
    kind: Service
    metadata: {name: backend, namespace: default}
    spec:
      selector: {app: backend}
      ports:
      - {name: http, port: 9080}
      - {name: tcp-db, port: 3306}
    ---
    apiVersion: networking.istio.io/v1
    kind: Sidecar
    metadata: {name: backend, namespace: default}
    spec:
      workloadSelector: {labels: {app: backend}}
      ingress:
      - port: {number: 9080, protocol: HTTP, name: http}
        defaultEndpoint: 127.0.0.1:8080
      - port: {number: 3306, protocol: TCP, name: tcp}
        defaultEndpoint: 127.0.0.1:3307
    """
)

TRACED = textwrap.dedent(
    """\
    accessLogFile: /tmp/access.log
    extensionProviders:
    - name: zipkin
      zipkin: {service: 127.0.0.9, port: 9411}
    - name: otel
      opentelemetry: {service: otel.observability.svc.cluster.local, port: 4317}
    defaultProviders: {tracing: [zipkin]}
    """
)


def proxy(mode: str = "NONE", app: str = "backend", ip: str = "127.0.1.5") -> Proxy:
    return proxy_from_node(
        f"sidecar~{ip}~{app}-1.default~default.svc.cluster.local",
        {"LABELS": {"app": app}, "INTERCEPTION_MODE": mode},
    )


def listeners(config: MeshConfig, mesh: str, p: Proxy) -> list[Listener]:
    idx = MeshIndex(config, [p.as_workload()], mesh=parse_mesh_config(mesh, "mesh.yaml"))
    ctx = GenContext(idx, ResourceCache())
    out = []
    for r in GENERATORS[LISTENER_TYPE](ctx, p).values():
        listener = Listener()
        wrapped = any_pb2.Any()
        wrapped.ParseFromString(r.any_bytes)
        assert wrapped.Unpack(listener)
        out.append(listener)
    return out


def filters(ls: list[Listener], name: str) -> list[tuple[str, any_pb2.Any]]:
    out = []
    for listener in ls:
        chains = [*listener.filter_chains]
        if listener.HasField("default_filter_chain"):
            chains.append(listener.default_filter_chain)
        for chain in chains:
            out.extend((listener.name, f.typed_config) for f in chain.filters if f.name == name)
    return out


@pytest.mark.parametrize("mode", ["NONE", "REDIRECT"])
def test_access_logs_on_every_hcm_and_tcp_proxy(mode: str) -> None:
    config = mesh_config(APP)
    ls = listeners(config, "accessLogFile: /tmp/access.log\n", proxy(mode))
    hcms = filters(ls, HCM_FILTER)
    tcps = filters(ls, TCP_PROXY_FILTER)
    assert hcms and tcps
    for _, any_config in hcms:
        hcm = HttpConnectionManager()
        assert any_config.Unpack(hcm)
        (log,) = hcm.access_log
        file_log = FileAccessLog()
        assert log.typed_config.Unpack(file_log)
        assert file_log.path == "/tmp/access.log"
        assert file_log.log_format.text_format_source.inline_string == ISTIO_TEXT_FORMAT
        assert not hcm.HasField("tracing")
    for _, any_config in tcps:
        tcp = TcpProxy()
        assert any_config.Unpack(tcp)
        assert len(tcp.access_log) == 1
    # Nothing without telemetry.
    for _, any_config in filters(listeners(config, "", proxy(mode)), HCM_FILTER):
        hcm = HttpConnectionManager()
        assert any_config.Unpack(hcm) and not hcm.access_log


def test_json_and_filter_are_generated() -> None:
    config = mesh_config(
        APP,
        telemetry(
            "errors",
            "default",
            "accessLogging:\n- providers: [{name: envoy}]\n"
            '  filter: {expression: "response.code >= 400"}',
        ),
    )
    ls = listeners(config, "", proxy())
    hcm = HttpConnectionManager()
    assert filters(ls, HCM_FILTER)[0][1].Unpack(hcm)
    (log,) = hcm.access_log
    comparison = log.filter.status_code_filter.comparison
    assert comparison.op == ComparisonFilter.GE and comparison.value.default_value == 400
    # /dev/stdout: Envoy's stdout logger (it writes to the inherited fd, whatever its owner).
    stdout_log = StdoutAccessLog()
    ls = listeners(
        mesh_config(APP), "accessLogFile: /dev/stdout\naccessLogEncoding: JSON\n", proxy()
    )
    assert filters(ls, HCM_FILTER)[0][1].Unpack(hcm)
    assert hcm.access_log[0].name == "envoy.access_loggers.stdout"
    assert hcm.access_log[0].typed_config.Unpack(stdout_log)
    assert dict(stdout_log.log_format.json_format.items()) == dict(ISTIO_JSON_LABELS)


def test_tracing_zipkin_on_every_hcm_and_its_collector_cluster() -> None:
    config = mesh_config(
        APP, telemetry("half", "default", "tracing: [{randomSamplingPercentage: 50}]")
    )
    p = proxy()
    ls = listeners(config, TRACED, p)
    hcm_filters = filters(ls, HCM_FILTER)
    assert hcm_filters
    for _, any_config in hcm_filters:
        hcm = HttpConnectionManager()
        assert any_config.Unpack(hcm)
        assert hcm.tracing.random_sampling.value == 50.0
        assert hcm.tracing.provider.name == "envoy.tracers.zipkin"
        zipkin = ZipkinConfig()
        assert hcm.tracing.provider.typed_config.Unpack(zipkin)
        assert zipkin.collector_cluster == "outbound|9411||127.0.0.9"
        assert zipkin.collector_endpoint == "/api/v2/spans"
        assert zipkin.collector_endpoint_version == ZipkinConfig.HTTP_JSON
        assert zipkin.trace_id_128bit
        tags = {t.tag: t.literal.value for t in hcm.tracing.custom_tags if t.HasField("literal")}
        assert tags["istio.canonical_service"] == "backend"
        assert tags["istio.namespace"] == "default" and tags["istio.mesh_id"] == "cluster.local"
    idx = MeshIndex(config, [p.as_workload()], mesh=parse_mesh_config(TRACED, "m"))
    clusters = GENERATORS[CLUSTER_TYPE](GenContext(idx, ResourceCache()), p)
    assert "outbound|9411||127.0.0.9" in clusters
    # No tracer, no collector cluster.
    idx = MeshIndex(config, [p.as_workload()], mesh=MeshSettings())
    assert "outbound|9411||127.0.0.9" not in GENERATORS[CLUSTER_TYPE](
        GenContext(idx, ResourceCache()), p
    )


def test_tracing_opentelemetry_grpc_cluster_is_http2() -> None:
    config = mesh_config(
        APP, telemetry("otel", "default", "tracing: [{providers: [{name: otel}]}]")
    )
    p = proxy()
    hcm = HttpConnectionManager()
    assert filters(listeners(config, TRACED, p), HCM_FILTER)[0][1].Unpack(hcm)
    otel = OpenTelemetryConfig()
    assert hcm.tracing.provider.typed_config.Unpack(otel)
    name = "outbound|4317||otel.observability.svc.cluster.local"
    assert otel.grpc_service.envoy_grpc.cluster_name == name
    assert otel.service_name == "backend.default"
    idx = MeshIndex(config, [p.as_workload()], mesh=parse_mesh_config(TRACED, "m"))
    clusters = GENERATORS[CLUSTER_TYPE](GenContext(idx, ResourceCache()), p)
    cluster = Cluster()
    wrapped = any_pb2.Any()
    wrapped.ParseFromString(clusters[name].any_bytes)
    assert wrapped.Unpack(cluster)
    assert cluster.typed_extension_protocol_options  # HTTP/2 for gRPC


def test_a_mesh_config_change_is_a_full_push() -> None:
    config = mesh_config(APP)
    old = MeshIndex(config)
    same = old.next(config)
    assert same.changed_since(old) is not None  # derived: only workloads could differ
    new = old.next(config, mesh=MeshSettings(access_log_file="/dev/stdout"))
    assert new.changed_since(old) is None


def test_use_request_id_for_trace_sampling_false_reaches_the_hcm() -> None:
    from envoy.extensions.request_id.uuid.v3.uuid_pb2 import UuidRequestIdConfig

    config = mesh_config(
        APP, telemetry("own", "default", "tracing: [{useRequestIdForTraceSampling: false}]")
    )
    for _, any_config in filters(listeners(config, TRACED, proxy()), HCM_FILTER):
        hcm = HttpConnectionManager()
        assert any_config.Unpack(hcm)
        uuid = UuidRequestIdConfig()
        assert hcm.request_id_extension.typed_config.Unpack(uuid)
        assert uuid.use_request_id_for_trace_sampling.value is False
    # Not said: Envoy's default, no extension.
    for _, any_config in filters(listeners(mesh_config(APP), TRACED, proxy()), HCM_FILTER):
        hcm = HttpConnectionManager()
        assert any_config.Unpack(hcm) and not hcm.HasField("request_id_extension")


def test_two_namespace_wide_telemetries_are_reported_and_the_first_used() -> None:
    config = mesh_config(
        telemetry("b", "default", "tracing: [{randomSamplingPercentage: 2}]"),
        telemetry("a", "default", "tracing: [{randomSamplingPercentage: 1}]"),
    )
    assert any("more than one Telemetry without selector" in w.message for w in config.warnings)
    mesh = "extensionProviders:\n- name: z\n  zipkin: {service: 127.0.0.9, port: 9411}\n"
    mesh += "defaultProviders: {tracing: [z]}\n"
    assert tel(index(config, mesh), app="x").client.tracing.sampling == 1.0  # "a"
