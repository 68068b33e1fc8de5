"""Real Envoy accepts the telemetry the control plane generates: file access logs (Istio's
TEXT format, its JSON labels, a custom format, status-code filters) on HTTP and TCP listeners
in both interception modes, the gRPC access log services (Envoy's ALS, OTLP logs), and the
Zipkin and OpenTelemetry tracers with their collector clusters, sampling and custom tags."""

from __future__ import annotations

from pathlib import Path

import pytest

from control.config.meshconfig import parse_mesh_config
from control.generate import GENERATORS
from control.generate.context import GenContext
from control.generate.resource_names import CLUSTER_TYPE
from control.model.index import MeshIndex
from control.model.proxy import proxy_from_node
from control.xds.cache import ResourceCache
from tests.integration.test_generate_envoy_validate import static_bootstrap, validate
from tests.support.traffic import mesh_config
from tests.unit.test_telemetry import APP, TRACED, telemetry

pytestmark = pytest.mark.envoy

OTEL_MESH = TRACED.replace(
    "defaultProviders: {tracing: [zipkin]}", "defaultProviders: {tracing: [otel]}"
)
# Every gRPC access log service kind, on HTTP and TCP listeners, with their collector clusters.
GRPC_LOGS_MESH = """\
extensionProviders:
- name: otel-als
  envoyOtelAls:
    service: otel.observability.svc.cluster.local
    port: 4317
    logName: mesh
    logFormat: {text: "%REQ(:PATH)% %RESPONSE_CODE%", labels: {code: "%RESPONSE_CODE%"}}
- name: http-als
  envoyHttpAls:
    service: 127.0.0.9
    port: 9001
    additionalRequestHeadersToLog: [x-user]
    additionalResponseHeadersToLog: [x-served-by]
    additionalResponseTrailersToLog: [grpc-message]
- name: tcp-als
  envoyTcpAls: {service: 127.0.0.9, port: 9001}
defaultProviders: {accessLogging: [otel-als, http-als, tcp-als]}
"""


@pytest.mark.parametrize(
    ("interception", "mesh", "telemetries"),
    [
        ("NONE", "accessLogFile: /dev/stdout\n", ""),
        ("REDIRECT", "accessLogFile: /dev/stdout\naccessLogEncoding: JSON\n", ""),
        (
            "NONE",
            'accessLogFile: /dev/stdout\naccessLogFormat: "%REQ(:METHOD)% %RESPONSE_CODE%"\n',
            telemetry(
                "errors",
                "default",
                "accessLogging:\n"
                '- filter: {expression: "response.code >= 400 && response.code != 503"}',
            ),
        ),
        (
            "REDIRECT",
            TRACED,
            telemetry(
                "traced",
                "default",
                """
                tracing:
                - randomSamplingPercentage: 50
                  useRequestIdForTraceSampling: false
                  customTags:
                    team: {literal: {value: payments}}
                    user: {header: {name: x-user, defaultValue: anon}}
                    pod: {environment: {name: POD_NAME}}
                accessLogging:
                - providers: [{name: envoy}]
                  filter: {expression: "response.code == 503 || response.code < 200"}
                """,
            ),
        ),
        ("NONE", OTEL_MESH, ""),
        ("REDIRECT", OTEL_MESH, ""),
        ("NONE", GRPC_LOGS_MESH, ""),
        (
            "REDIRECT",
            GRPC_LOGS_MESH,
            telemetry(
                "errors",
                "default",
                "accessLogging:\n"
                "- providers: [{name: otel-als}]\n"
                '  filter: {expression: "response.code >= 400"}',
            ),
        ),
    ],
)
def test_envoy_accepts_generated_telemetry(
    tmp_path: Path, interception: str, mesh: str, telemetries: str
) -> None:
    config = mesh_config(APP, telemetries)
    proxy = proxy_from_node(
        "sidecar~127.0.1.5~backend-1.default~default.svc.cluster.local",
        {"LABELS": {"app": "backend"}, "INTERCEPTION_MODE": interception},
    )
    index = MeshIndex(config, [proxy.as_workload()], mesh=parse_mesh_config(mesh, "mesh.yaml"))
    sets = {t: gen(GenContext(index, ResourceCache()), proxy) for t, gen in GENERATORS.items()}
    if "extensionProviders" in mesh:
        assert any(
            n.startswith(("outbound|9411||", "outbound|4317||", "outbound|9001||"))
            for n in sets[CLUSTER_TYPE]
        )
    bootstrap = static_bootstrap(proxy, sets)
    if "envoyOtelAls" in mesh:
        # The OTel logger's fields newer than the bundled protos are unknown fields here,
        # which JSON cannot carry: Envoy reads this bootstrap as binary, as it reads xDS.
        result = validate(bootstrap, tmp_path / "envoy.pb")
    else:
        result = validate(bootstrap, tmp_path / "envoy.json")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "deprecated" not in output.lower(), output
