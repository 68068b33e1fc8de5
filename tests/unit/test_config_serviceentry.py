"""Istio ServiceEntry -> model Services (control/config/kinds/serviceentry.py)."""

from __future__ import annotations

import textwrap

import pytest

from control.config import protocols
from control.config.errors import ConfigError
from control.config.loader import load_text
from control.model.types import (
    Protocol,
    Resolution,
    Service,
    ServicePort,
    SourceRef,
    WorkloadEndpointSpec,
)


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


EXTERNAL_API = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: external-apis
  namespace: egress
spec:
  hosts:
  - api.example.com
  - "*.storage.example.com"
  addresses:
  - 240.240.0.1
  - 240.240.1.0/24
  ports:
  - number: 443
    name: https
    protocol: TLS
  - number: 80
    name: http
    protocol: http
    targetPort: 8080
  location: MESH_EXTERNAL
  resolution: DNS
  endpoints:
  - address: api.example.com
    ports:
      https: 8443
    labels:
      region: eu
    locality: europe-west1/europe-west1-b
    weight: 3
    network: internet
  exportTo: ["."]
"""


def test_realistic_external_service_entry_one_service_per_host() -> None:
    fc = load_text(dedent(EXTERNAL_API), "se.yaml")
    assert fc.warnings == ()
    (obj,) = fc.objects
    source = SourceRef("ServiceEntry", "egress", "external-apis", "se.yaml", 1)
    ports = (
        ServicePort("https", 443, Protocol.TLS, None),
        ServicePort("http", 80, Protocol.HTTP, 8080),
    )
    endpoint = WorkloadEndpointSpec(
        address="api.example.com",
        ports=(("https", 8443),),
        labels=(("region", "eu"),),
        network="internet",
        locality="europe-west1/europe-west1-b",
        weight=3,
    )
    expected = [
        Service(
            hostname=host,
            namespace="egress",
            name="external-apis",
            ports=ports,
            source=source,
            selector=None,
            addresses=("240.240.0.1", "240.240.1.0/24"),
            mesh_external=True,
            resolution=Resolution.DNS,
            registry="External",
            static_endpoints=(endpoint,),
            workload_selector=None,
            export_to=(".",),
        )
        for host in ("api.example.com", "*.storage.example.com")
    ]
    assert list(obj.services) == expected


def test_mesh_internal_static_with_workload_selector() -> None:
    fc = load_text(
        dedent(
            """
            apiVersion: networking.istio.io/v1beta1
            kind: ServiceEntry
            metadata: {name: details-vm, namespace: bookinfo}
            spec:
              hosts: [details.bookinfo.svc.cluster.local]
              location: MESH_INTERNAL
              resolution: STATIC
              ports:
              - {number: 9080, name: http, protocol: HTTP}
              workloadSelector:
                labels: {app: details}
            """
        ),
        "se.yaml",
    )
    (service,) = fc.objects[0].services
    assert service.mesh_external is False
    assert service.resolution is Resolution.STATIC
    assert service.workload_selector == (("app", "details"),)
    assert service.static_endpoints == ()
    assert service.selector is None
    assert service.export_to == ("*",)


def test_defaults_follow_istio() -> None:
    fc = load_text(
        dedent(
            """
            apiVersion: networking.istio.io/v1alpha3
            kind: ServiceEntry
            metadata: {name: httpbin}
            spec:
              hosts: [httpbin.org]
              ports:
              - {number: 80, name: http-web}
              - {number: 81}
            """
        ),
        "se.yaml",
    )
    (service,) = fc.objects[0].services
    assert service.mesh_external is True  # MESH_EXTERNAL is Istio's default location
    assert service.resolution is Resolution.NONE  # and NONE its default resolution
    # Without a protocol the port-name convention applies, else UNKNOWN.
    assert [p.protocol for p in service.ports] == [Protocol.HTTP, Protocol.UNKNOWN]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("HTTP", Protocol.HTTP),
        ("http", Protocol.HTTP),
        ("HTTP2", Protocol.HTTP2),
        ("GRPC", Protocol.GRPC),
        ("grpc-web", Protocol.HTTP),
        ("TCP", Protocol.TCP),
        ("TLS", Protocol.TLS),
        ("HTTPS", Protocol.HTTPS),
        ("MONGO", Protocol.TCP),
        ("Redis", Protocol.TCP),
        ("MYSQL", Protocol.TCP),
    ],
)
def test_istio_protocol_names(value: str, expected: Protocol) -> None:
    assert protocols.from_istio_name(value) is expected
    text = (
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: p}\n"
        f"spec:\n  hosts: [p.example.com]\n  ports:\n  - {{number: 80, protocol: {value}}}\n"
    )
    (service,) = load_text(text, "p.yaml").objects[0].services
    assert service.ports[0].protocol is expected


def test_udp_port_is_skipped_with_a_warning() -> None:
    fc = load_text(
        dedent(
            """
            apiVersion: networking.istio.io/v1
            kind: ServiceEntry
            metadata: {name: ntp}
            spec:
              hosts: [time.example.com]
              ports:
              - {number: 123, name: ntp, protocol: UDP}
              - {number: 443, name: https, protocol: HTTPS}
            """
        ),
        "se.yaml",
    )
    assert [p.port for p in fc.objects[0].services[0].ports] == [443]
    assert [w.message for w in fc.warnings] == [
        "spec.ports[0]: protocol UDP is not supported; port 123 ignored"
    ]


def test_unsupported_fields_are_warnings() -> None:
    text = dedent(EXTERNAL_API) + "  subjectAltNames: [spiffe://x/ns/y/sa/z]\n"
    text = text.replace("    weight: 3\n", "    weight: 3\n    serviceAccnt: x\n")
    fc = load_text(text, "se.yaml")
    assert len(fc.objects) == 1
    assert [w.message for w in fc.warnings] == [
        "spec.endpoints[0].serviceAccnt is not supported; ignored",
        "spec.subjectAltNames is not supported; ignored",
    ]


HEADER = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata:\n  name: ext\nspec:\n"
HOSTS = "  hosts: [api.example.com]\n"


@pytest.mark.parametrize(
    ("spec_yaml", "line", "message"),
    [
        ("  ports: []\n", 5, "spec.hosts: is required (a non-empty list)"),
        ("  hosts: []\n", 6, "spec.hosts: is required (a non-empty list)"),
        ("  hosts: api.example.com\n", 6, "spec.hosts: must be a list, got a string"),
        (
            "  hosts:\n  - ok.example.com\n  - '*'\n",
            8,
            "spec.hosts[1]: '*' is not allowed: a ServiceEntry must name its hosts",
        ),
        (
            "  hosts:\n  - bad_host.example.com\n",
            7,
            "spec.hosts[0]: must be a DNS name like "
            "api.example.com, or a wildcard like *.example.com (got 'bad_host.example.com')",
        ),
        (
            "  hosts:\n  - a.example.com\n  - a.example.com\n",
            8,
            "spec.hosts[1]: duplicate host 'a.example.com'",
        ),
        (
            HOSTS + "  ports:\n  - number: 80\n    protocol: QUIC\n",
            9,
            "spec.ports[0].protocol: "
            "unknown protocol 'QUIC'; use one of HTTP, HTTPS, HTTP2, GRPC, GRPC-WEB, TLS, TCP, "
            "MONGO, REDIS, MYSQL",
        ),
        (
            HOSTS + "  ports:\n  - name: http\n    protocol: HTTP\n",
            8,
            "spec.ports[0].number: is required",
        ),
        (
            HOSTS + "  ports:\n  - number: 65536\n",
            8,
            "spec.ports[0].number: must be an integer 1-65535",
        ),
        (
            HOSTS + "  ports:\n  - {number: 80, name: a}\n  - {number: 80, name: b}\n",
            9,
            "spec.ports[1].number: duplicate port 80 (also in spec.ports[0])",
        ),
        (
            HOSTS + "  ports:\n  - {number: 80, name: a}\n  - {number: 81, name: a}\n",
            9,
            "spec.ports[1].name: duplicate port name 'a' (also in spec.ports[0])",
        ),
        (
            HOSTS + "  ports:\n  - number: 80\n    targetPort: http\n",
            9,
            "spec.ports[0].targetPort: must be an integer 1-65535",
        ),
        (
            HOSTS + "  resolution: dns\n",
            7,
            "spec.resolution: must be one of NONE, STATIC, DNS (got 'dns')",
        ),
        (
            HOSTS + "  location: EXTERNAL\n",
            7,
            "spec.location: must be one of MESH_EXTERNAL, MESH_INTERNAL (got 'EXTERNAL')",
        ),
        (
            HOSTS + "  addresses: [10.0.0.0/33]\n",
            7,
            "spec.addresses[0]: must be an IP address or a CIDR range (got '10.0.0.0/33')",
        ),
        (
            HOSTS + "  resolution: STATIC\n  endpoints:\n  - address: api.example.com\n",
            9,
            "spec.endpoints[0].address: must be an IP address (got 'api.example.com')",
        ),
        (
            HOSTS + "  resolution: DNS\n  endpoints:\n  - address: 'bad host'\n",
            9,
            "spec.endpoints[0].address: must be an IP address or a hostname (got 'bad host')",
        ),
        (
            HOSTS + "  resolution: STATIC\n  endpoints:\n  - ports: {http: 80}\n",
            9,
            "spec.endpoints[0].address: is required",
        ),
        (
            HOSTS + "  resolution: STATIC\n  endpoints:\n  - address: 1.2.3.4\n"
            "    ports: {http: 99999}\n",
            10,
            "spec.endpoints[0].ports.http: must be an integer 1-65535",
        ),
        (
            HOSTS + "  endpoints:\n  - address: 1.2.3.4\n",
            7,
            "spec.endpoints: must be empty when resolution is NONE (set STATIC or DNS)",
        ),
        (
            HOSTS + "  resolution: STATIC\n  endpoints:\n  - address: 1.2.3.4\n"
            "  workloadSelector:\n    labels: {app: a}\n",
            10,
            "spec.workloadSelector: cannot be used together with endpoints; use one of them",
        ),
        (
            "  hosts: ['*.example.com']\n  resolution: DNS\n",
            6,
            "spec.hosts[0]: wildcard host "
            "'*.example.com' needs endpoints when resolution is DNS (there is nothing to resolve)",
        ),
        (
            HOSTS + "  exportTo: ['*', '.']\n",
            7,
            "spec.exportTo: '*' cannot be combined with other values",
        ),
        (
            HOSTS + "  exportTo: [Team_A]\n",
            7,
            "spec.exportTo[0]: must be '*', '.', '~' or a "
            "namespace name: must be a DNS label: at most 63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit",
        ),
    ],
)
def test_errors(spec_yaml: str, line: int, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(HEADER + spec_yaml, "se.yaml")
    assert str(info.value) == f"se.yaml:{line}: ServiceEntry default/ext: {message}"


def test_unix_socket_endpoint_for_static_resolution() -> None:
    text = (
        HEADER + HOSTS + "  resolution: STATIC\n  endpoints:\n  - address: unix:///var/run/a.sock\n"
    )
    (service,) = load_text(text, "se.yaml").objects[0].services
    assert service.static_endpoints[0].address == "unix:///var/run/a.sock"
