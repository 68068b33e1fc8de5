"""Istio Sidecar -> model SidecarScope (control/config/kinds/sidecar.py)."""

from __future__ import annotations

import textwrap

import pytest

from control.config.errors import ConfigError
from control.config.loader import load_text
from control.model.types import (
    CaptureMode,
    EgressListener,
    IngressListener,
    Protocol,
    SidecarPort,
    SidecarScope,
    SourceRef,
)


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


# A local pod (DESIGN "Local pods on one machine"): explicit listeners, interception NONE.
RATINGS = """
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata:
  name: ratings
  namespace: bookinfo
spec:
  workloadSelector:
    labels:
      app: ratings
  ingress:
  - port:
      number: 9080
      protocol: HTTP
      name: http
    defaultEndpoint: 0.0.0.0:8080
    captureMode: NONE
  - port: {number: 9090, protocol: GRPC, name: grpc}
    bind: 127.0.1.3
    defaultEndpoint: unix:///var/run/ratings.sock
  egress:
  - port: {number: 9080, protocol: HTTP, name: http}
    bind: 127.0.1.3
    captureMode: NONE
    hosts:
    - ./reviews.bookinfo.svc.cluster.local
    - "istio-system/*"
  - hosts:
    - "./*"
    - "*/*.example.com"
  outboundTrafficPolicy:
    mode: REGISTRY_ONLY
"""


def test_realistic_sidecar() -> None:
    fc = load_text(dedent(RATINGS), "sc.yaml")
    assert fc.warnings == ()
    (obj,) = fc.objects
    assert obj.sidecars == (
        SidecarScope(
            namespace="bookinfo",
            name="ratings",
            source=SourceRef("Sidecar", "bookinfo", "ratings", "sc.yaml", 1),
            workload_selector=(("app", "ratings"),),
            ingress=(
                IngressListener(
                    port=SidecarPort(9080, Protocol.HTTP, "http"),
                    default_endpoint="0.0.0.0:8080",
                    capture_mode=CaptureMode.NONE,
                ),
                IngressListener(
                    port=SidecarPort(9090, Protocol.GRPC, "grpc"),
                    bind="127.0.1.3",
                    default_endpoint="unix:///var/run/ratings.sock",
                ),
            ),
            egress=(
                EgressListener(
                    hosts=("./reviews.bookinfo.svc.cluster.local", "istio-system/*"),
                    port=SidecarPort(9080, Protocol.HTTP, "http"),
                    bind="127.0.1.3",
                    capture_mode=CaptureMode.NONE,
                ),
                EgressListener(hosts=("./*", "*/*.example.com")),
            ),
            outbound_traffic_policy="REGISTRY_ONLY",
        ),
    )


def test_namespace_wide_sidecar_defaults() -> None:
    fc = load_text(
        dedent(
            """
            apiVersion: networking.istio.io/v1beta1
            kind: Sidecar
            metadata: {name: default, namespace: shop}
            spec:
              egress:
              - hosts: ["./*", "istio-system/*"]
            """
        ),
        "sc.yaml",
    )
    (scope,) = fc.objects[0].sidecars
    assert scope.workload_selector is None
    assert scope.ingress == ()
    assert scope.outbound_traffic_policy == ""  # the mesh-wide default applies
    assert scope.egress == (EgressListener(hosts=("./*", "istio-system/*")),)


@pytest.mark.parametrize(
    "endpoint", ["127.0.0.1:8080", "0.0.0.0:1", "[::1]:8080", "[::]:65535", "unix://@abstract"]
)
def test_default_endpoint_forms(endpoint: str) -> None:
    text = dedent(RATINGS).replace("0.0.0.0:8080", f'"{endpoint}"')
    scope = load_text(text, "sc.yaml").objects[0].sidecars[0]
    assert scope.ingress[0].default_endpoint == endpoint


def test_unsupported_fields_are_warnings() -> None:
    text = dedent(RATINGS)
    text = text.replace(
        "    captureMode: NONE\n  - port: {number: 9090",
        ("    captureMode: NONE\n    tls: {mode: SIMPLE}\n  - port: {number: 9090"),
    )
    text += "    egressProxy: {host: proxy.example.com}\n  inboundConnectionPool: {}\n"
    fc = load_text(text, "sc.yaml")
    assert len(fc.objects) == 1
    assert [w.message for w in fc.warnings] == [
        "spec.ingress[0].tls is not supported; ignored",
        "spec.outboundTrafficPolicy.egressProxy is not supported; ignored",
        "spec.inboundConnectionPool is not supported; ignored",
    ]


HEADER = "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata:\n  name: sc\nspec:\n"


@pytest.mark.parametrize(
    ("spec_yaml", "line", "message"),
    [
        (
            "  workloadSelector:\n    labels: {}\n",
            7,
            "spec.workloadSelector.labels: must have "
            "at least one label (omit workloadSelector to apply to the whole namespace)",
        ),
        (
            "  ingress:\n  - defaultEndpoint: 127.0.0.1:8080\n",
            7,
            "spec.ingress[0].port: is required",
        ),
        (
            "  ingress:\n  - port: {number: 80, protocol: HTTP}\n",
            7,
            "spec.ingress[0].defaultEndpoint: is required",
        ),
        (
            "  ingress:\n  - port:\n      number: 80\n    defaultEndpoint: 127.0.0.1:8080\n",
            7,
            "spec.ingress[0].port.protocol: is required",
        ),
        (
            "  ingress:\n  - port:\n      number: 80\n      protocol: UDP\n"
            "    defaultEndpoint: 127.0.0.1:8080\n",
            9,
            "spec.ingress[0].port.protocol: unknown or "
            "unsupported protocol 'UDP'; use one of HTTP, HTTPS, HTTP2, GRPC, GRPC-WEB, TLS, TCP, "
            "MONGO, REDIS, MYSQL",
        ),
        (
            "  ingress:\n  - port:\n      number: 0\n      protocol: HTTP\n"
            "    defaultEndpoint: 127.0.0.1:8080\n",
            8,
            "spec.ingress[0].port.number: must be an integer 1-65535",
        ),
        (
            "  ingress:\n  - port: {number: 80, protocol: HTTP}\n    defaultEndpoint: "
            "10.1.2.3:8080\n",
            8,
            "spec.ingress[0].defaultEndpoint: must be 127.0.0.1:PORT, "
            "0.0.0.0:PORT, [::1]:PORT, [::]:PORT or unix:///path (got '10.1.2.3:8080')",
        ),
        (
            "  ingress:\n  - port: {number: 80, protocol: HTTP}\n    defaultEndpoint: "
            "127.0.0.1:http\n",
            8,
            "spec.ingress[0].defaultEndpoint: must be 127.0.0.1:PORT, "
            "0.0.0.0:PORT, [::1]:PORT, [::]:PORT or unix:///path (got '127.0.0.1:http')",
        ),
        (
            "  ingress:\n  - port: {number: 80, protocol: HTTP}\n    defaultEndpoint: "
            "unix://relative\n",
            8,
            "spec.ingress[0].defaultEndpoint: must be 127.0.0.1:PORT, "
            "0.0.0.0:PORT, [::1]:PORT, [::]:PORT or unix:///path (got 'unix://relative')",
        ),
        (
            "  ingress:\n  - port: {number: 80, protocol: HTTP}\n    defaultEndpoint: "
            "127.0.0.1:8080\n    captureMode: REDIRECT\n",
            9,
            "spec.ingress[0].captureMode: must be one of DEFAULT, IPTABLES, NONE (got 'REDIRECT')",
        ),
        (
            "  ingress:\n  - port: {number: 80, protocol: HTTP}\n    defaultEndpoint: "
            "127.0.0.1:8080\n    bind: localhost\n",
            9,
            "spec.ingress[0].bind: must be an IP address (got 'localhost')",
        ),
        (
            "  ingress:\n  - port: {number: 80, protocol: HTTP}\n    defaultEndpoint: "
            "127.0.0.1:8080\n  - port: {number: 80, protocol: TCP}\n    defaultEndpoint: "
            "127.0.0.1:8081\n",
            9,
            "spec.ingress[1].port: duplicate ingress port 80 (also in spec.ingress[0])",
        ),
        (
            "  egress:\n  - port: {number: 80, protocol: HTTP}\n",
            7,
            "spec.egress[0].hosts: is required (a non-empty list)",
        ),
        (
            "  egress:\n  - hosts:\n    - reviews.bookinfo.svc.cluster.local\n",
            8,
            'spec.egress[0].hosts[0]: must be "namespace/dnsName", e.g. "./*", '
            '"istio-system/*" or "*/api.example.com" (got \'reviews.bookinfo.svc.cluster.local\')',
        ),
        (
            "  egress:\n  - hosts: ['Bad_NS/*']\n",
            7,
            "spec.egress[0].hosts[0]: namespace 'Bad_NS' must be '*', '.', '~' or a namespace name",
        ),
        (
            "  egress:\n  - hosts: ['./bad host']\n",
            7,
            "spec.egress[0].hosts[0]: host 'bad host' "
            "must be a DNS name like api.example.com, or a wildcard like *.example.com, or '*'",
        ),
        (
            "  egress:\n  - hosts: ['./']\n",
            7,
            "spec.egress[0].hosts[0]: must be "
            '"namespace/dnsName", e.g. "./*", "istio-system/*" or "*/api.example.com" '
            "(got './')",
        ),
        (
            "  egress:\n  - hosts: ['./*']\n    bind: 127.0.1.2\n",
            8,
            "spec.egress[0].bind: requires a port (a listener without a port has no address)",
        ),
        (
            "  egress:\n  - hosts: ['./*']\n  - hosts: ['istio-system/*']\n"
            "    port: {number: 80, protocol: HTTP}\n",
            7,
            "spec.egress[0]: an egress listener "
            "without a port catches all other ports; it must be the last one",
        ),
        (
            "  outboundTrafficPolicy:\n    mode: DENY\n",
            7,
            "spec.outboundTrafficPolicy.mode: must be one of ALLOW_ANY, REGISTRY_ONLY (got 'DENY')",
        ),
        ("  ingress: {}\n", 6, "spec.ingress: must be a list, got a mapping"),
    ],
)
def test_errors(spec_yaml: str, line: int, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(HEADER + spec_yaml, "sc.yaml")
    assert str(info.value) == f"sc.yaml:{line}: Sidecar default/sc: {message}"
