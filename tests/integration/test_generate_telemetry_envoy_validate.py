"""Real Envoy accepts the telemetry the control plane generates: file access logs (Istio's
TEXT format, its JSON labels, a custom format, status-code filters) on HTTP and TCP listeners
in both interception modes, and the Zipkin and OpenTelemetry tracers with their collector
clusters, sampling and custom tags."""

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
            n.startswith("outbound|9411||") or n.startswith("outbound|4317||")
            for n in sets[CLUSTER_TYPE]
        )
    result = validate(static_bootstrap(proxy, sets), tmp_path / "envoy.json")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "deprecated" not in output.lower(), output
