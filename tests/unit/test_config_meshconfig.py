"""The MeshConfig parser (Istio's field names and defaults, `file:line` errors, unsupported
fields reported) and the effective mesh config (inputs in order, flags on top)."""

from __future__ import annotations

import textwrap

import pytest

from control.config.errors import ConfigError
from control.config.meshconfig import parse_mesh_config
from control.config.meshwatch import EffectiveMeshConfig
from control.model.meshconfig import (
    AccessLogEncoding,
    FileAccessLogProvider,
    GrpcAccessLogProvider,
    MeshOverrides,
    MeshSettings,
    OpenTelemetryProvider,
    PrometheusProvider,
    ZipkinProvider,
)

FULL = textwrap.dedent(
    """\
    accessLogFile: /dev/stdout
    accessLogEncoding: JSON
    accessLogFormat: '{"code": "%RESPONSE_CODE%"}'
    enableTracing: true
    trustDomain: example.org
    outboundTrafficPolicy:
      mode: REGISTRY_ONLY
    defaultConfig:
      drainDuration: 12s
      holdApplicationUntilProxyStarts: true
      proxyMetadata:
        ISTIO_META_DNS_CAPTURE: "true"
      tracing:
        sampling: 25.5
    defaultProviders:
      tracing: [zipkin]
      accessLogging: [json-file]
    extensionProviders:
    - name: zipkin
      zipkin: {service: zipkin.istio-system.svc.cluster.local, port: 9411, maxTagLength: 64}
    - name: otel
      opentelemetry:
        service: otel.observability.svc.cluster.local
        port: 4317
        grpc: {timeout: 2s}
    - name: json-file
      envoyFileAccessLog:
        path: /var/log/access.json
        logFormat:
          labels: {code: "%RESPONSE_CODE%", path: "%REQ(:PATH)%"}
    - name: als
      envoyOtelAls:
        service: otel.observability.svc.cluster.local
        port: 4317
        logName: mesh
        logFormat: {text: "%REQ(:PATH)% %RESPONSE_CODE%", labels: {code: "%RESPONSE_CODE%"}}
    - name: http-als
      envoyHttpAls:
        service: als.observability.svc.cluster.local
        port: 9001
        additionalRequestHeadersToLog: [x-user]
        additionalResponseHeadersToLog: [x-served-by]
        additionalResponseTrailersToLog: [grpc-message]
        filterStateObjectsToLog: [envoy.network.upstream_server_name]
    - name: tcp-als
      envoyTcpAls: {service: als.observability.svc.cluster.local, port: 9001}
    """
)


def test_every_supported_field() -> None:
    mesh = parse_mesh_config(FULL, "mesh.yaml")
    assert mesh.access_log_file == "/dev/stdout"
    assert mesh.access_log_encoding is AccessLogEncoding.JSON
    assert mesh.access_log_format == '{"code": "%RESPONSE_CODE%"}'
    assert mesh.trust_domain == "example.org"
    assert mesh.outbound_traffic_policy == "REGISTRY_ONLY"
    assert mesh.default_config.drain_duration == 12.0
    assert mesh.default_config.hold_application_until_proxy_starts is True
    assert mesh.default_config.proxy_metadata == (("ISTIO_META_DNS_CAPTURE", "true"),)
    assert mesh.default_config.tracing_sampling == 25.5
    assert mesh.default_providers.tracing == ("zipkin",)
    assert mesh.default_providers.access_logging == ("json-file",)
    assert mesh.default_providers.metrics == ("prometheus",)  # Istio's default stays
    assert mesh.provider("zipkin") == ZipkinProvider(
        "zipkin.istio-system.svc.cluster.local", 9411, max_tag_length=64
    )
    assert mesh.provider("otel") == OpenTelemetryProvider(
        "otel.observability.svc.cluster.local", 4317, timeout=2.0
    )
    assert mesh.provider("json-file") == FileAccessLogProvider(
        "/var/log/access.json",
        labels=(("code", "%RESPONSE_CODE%"), ("path", "%REQ(:PATH)%")),
    )
    assert mesh.provider("als") == GrpcAccessLogProvider(
        "envoyOtelAls",
        "otel.observability.svc.cluster.local",
        4317,
        "mesh",
        text="%REQ(:PATH)% %RESPONSE_CODE%",
        labels=(("code", "%RESPONSE_CODE%"),),
    )
    assert mesh.provider("http-als") == GrpcAccessLogProvider(
        "envoyHttpAls",
        "als.observability.svc.cluster.local",
        9001,
        request_headers=("x-user",),
        response_headers=("x-served-by",),
        response_trailers=("grpc-message",),
        filter_state_objects=("envoy.network.upstream_server_name",),
    )
    assert mesh.provider("tcp-als") == GrpcAccessLogProvider(
        "envoyTcpAls", "als.observability.svc.cluster.local", 9001
    )
    # Istio's built-ins are there too.
    assert mesh.provider("envoy") == FileAccessLogProvider("/dev/stdout")
    assert isinstance(mesh.provider("prometheus"), PrometheusProvider)
    assert mesh.warnings == ()


def test_defaults_are_istios() -> None:
    mesh = parse_mesh_config("", "mesh.yaml")
    assert mesh == MeshSettings()
    assert mesh.access_log_file == ""
    assert mesh.access_log_encoding is AccessLogEncoding.TEXT
    assert mesh.enable_tracing is True
    assert mesh.default_config.drain_duration is None  # the agent's own default
    assert mesh.default_config.tracing_sampling == 1.0
    assert mesh.outbound_traffic_policy == "ALLOW_ANY"
    assert mesh.trust_domain == "cluster.local"
    assert mesh.default_providers.metrics == ("prometheus",)


def test_user_provider_replaces_a_builtin_of_the_same_name() -> None:
    mesh = parse_mesh_config(
        "extensionProviders:\n- name: envoy\n  envoyFileAccessLog: {path: /tmp/x.log}\n", "m"
    )
    assert mesh.provider("envoy") == FileAccessLogProvider("/tmp/x.log")
    assert [p.name for p in mesh.extension_providers].count("envoy") == 1


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("accessLogEncoding: XML\n", 1, "accessLogEncoding: must be one of TEXT, JSON"),
        ("a: 1\noutboundTrafficPolicy: {mode: DENY}\n", 2, "outboundTrafficPolicy.mode"),
        ("defaultConfig:\n  drainDuration: soon\n", 2, "defaultConfig.drainDuration"),
        ("defaultConfig:\n  tracing:\n    sampling: 200\n", 3, "sampling: must be a number"),
        (
            "extensionProviders:\n- name: z\n  zipkin: {service: zipkin}\n",
            3,
            "extensionProviders[0].zipkin.port: is required",
        ),
        (
            "extensionProviders:\n- name: z\n  zipkin: {service: a, port: 1}\n"
            "- name: z\n  prometheus: {}\n",
            4,
            "duplicate extension provider 'z'",
        ),
        ("enableTracing: maybe\n", 1, "enableTracing: must be true or false"),
        ("- a\n- b\n", 1, "must be a mapping"),
        ("accessLogFile: [\n", 2, "invalid YAML"),
    ],
)
def test_bad_values_are_file_line_errors(text: str, line: int, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_mesh_config(text, "mesh.yaml")
    assert info.value.file == "mesh.yaml"
    assert info.value.line == line, str(info.value)
    assert reason in str(info.value)
    assert str(info.value).startswith(f"mesh.yaml:{line}: ")


def test_unsupported_fields_are_reported_once() -> None:
    mesh = parse_mesh_config("accessLogFile: /dev/stdout\nthriftConfig: {}\n", "mesh.yaml")
    assert [w.message for w in mesh.warnings] == ["thriftConfig is not supported; ignored"]


class _Input:
    def __init__(self, name: str, current: MeshSettings | None) -> None:
        self.name = name
        self.current = current
        self.error = None
        self.on_change = lambda: None

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass


async def test_first_input_with_a_config_wins_and_flags_win_over_it() -> None:
    kube = _Input("configmap", None)
    file = _Input(
        "file", MeshSettings(access_log_file="/a", outbound_traffic_policy="REGISTRY_ONLY")
    )
    effective = EffectiveMeshConfig(
        [kube, file],
        MeshOverrides(trust_domain="pinned.local", outbound_traffic_policy="ALLOW_ANY"),
    )
    seen: list[MeshSettings] = []
    effective.subscribe(seen.append)
    await effective.start()
    assert effective.current.access_log_file == "/a"
    assert effective.current.outbound_traffic_policy == "ALLOW_ANY"  # the flag
    assert effective.current.trust_domain == "pinned.local"
    # The ConfigMap appears: it wins over the file.
    kube.current = MeshSettings(access_log_file="/b", trust_domain="other.org")
    kube.on_change()
    assert [s.access_log_file for s in seen] == ["/b"]
    assert seen[0].trust_domain == "pinned.local"  # identities keep the start value
    # An equal effective config is not handed over again.
    kube.on_change()
    assert len(seen) == 1
    # It goes away: the file applies again.
    kube.current = None
    kube.on_change()
    assert [s.access_log_file for s in seen] == ["/b", "/a"]


def test_default_config_reaches_injected_agents() -> None:
    """defaultConfig.proxyMetadata becomes the injected agent's environment, as in Istio;
    drainDuration its PILOTFISH_DRAIN_DURATION, the default of --drain-duration."""
    from control.webhook.inject import injection_patch
    from control.webhook.values import InjectionValues
    from tests.unit.test_webhook_inject import ENABLED, TEMPLATE, app_pod, apply_patch, env_of

    mesh = parse_mesh_config(
        "defaultConfig:\n  drainDuration: 12s\n  proxyMetadata: {ISTIO_META_DNS_CAPTURE: 'true'}\n",
        "mesh.yaml",
    )
    values = InjectionValues(
        proxy_metadata=mesh.default_config.proxy_metadata,
        drain_duration=mesh.default_config.drain_duration,
    )
    pod = app_pod()
    decision, patch = injection_patch(pod, ENABLED, TEMPLATE, values)
    assert decision.inject
    agent = next(
        c for c in apply_patch(pod, patch)["spec"]["containers"] if c["name"] == "istio-proxy"
    )
    env = env_of(agent)
    assert env["ISTIO_META_DNS_CAPTURE"] == "true"
    assert env["PILOTFISH_DRAIN_DURATION"] == "12"
    # Unset: nothing added, the agent keeps its own default.
    decision, patch = injection_patch(pod, ENABLED, TEMPLATE, InjectionValues())
    agent = next(
        c for c in apply_patch(pod, patch)["spec"]["containers"] if c["name"] == "istio-proxy"
    )
    assert "PILOTFISH_DRAIN_DURATION" not in env_of(agent)


def test_agent_drain_duration_default_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.config import build_parser

    monkeypatch.setenv("PILOTFISH_DRAIN_DURATION", "12")
    assert build_parser().parse_args([]).drain_duration == 12.0
    assert build_parser().parse_args(["--drain-duration", "3"]).drain_duration == 3.0
    monkeypatch.delenv("PILOTFISH_DRAIN_DURATION")
    assert build_parser().parse_args([]).drain_duration == 5.0
