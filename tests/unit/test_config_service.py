"""Kubernetes v1 Service -> model Service (control/config/kinds/service.py)."""

from __future__ import annotations

import textwrap

import pytest

from control.config.errors import ConfigError
from control.config.loader import load_text
from control.config.objects import FileConfig
from control.model.types import Protocol, Resolution, Service, ServicePort, SourceRef


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def load(text: str, domain: str = "cluster.local") -> FileConfig:
    return load_text(dedent(text), "svc.yaml", domain)


def only_service(text: str) -> Service:
    (obj,) = load(text).objects
    (service,) = obj.services
    return service


def error_of(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(text)
    return info.value


def messages(fc: FileConfig) -> list[str]:
    return [w.message for w in fc.warnings]


# The Bookinfo reviews service, as `kubectl get -o yaml` prints it (status and bookkeeping).
REVIEWS = """
apiVersion: v1
kind: Service
metadata:
  name: reviews
  namespace: bookinfo
  labels:
    app: reviews
    service: reviews
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: "{}"
  creationTimestamp: "2024-05-01T10:00:00Z"
  resourceVersion: "12345"
  uid: 0b5c9a38-6e1e-4d4b-9b3f-3a0d2c0c7a11
spec:
  clusterIP: 10.96.12.34
  clusterIPs:
  - 10.96.12.34
  internalTrafficPolicy: Cluster
  ipFamilies:
  - IPv4
  ipFamilyPolicy: SingleStack
  ports:
  - name: http
    port: 9080
    protocol: TCP
    targetPort: 9080
  selector:
    app: reviews
  sessionAffinity: None
  type: ClusterIP
status:
  loadBalancer: {}
"""


def test_kubectl_output_loads_without_warnings() -> None:
    fc = load(REVIEWS)
    assert fc.warnings == ()
    (obj,) = fc.objects
    assert obj.source == SourceRef("Service", "bookinfo", "reviews", "svc.yaml", 1)
    assert obj.raw["metadata"]["name"] == "reviews"
    assert obj.services == (
        Service(
            hostname="reviews.bookinfo.svc.cluster.local",
            namespace="bookinfo",
            name="reviews",
            ports=(ServicePort("http", 9080, Protocol.HTTP, 9080),),
            source=obj.source,
            selector=(("app", "reviews"),),
            addresses=("10.96.12.34",),
            resolution=Resolution.STATIC,
            registry="Kubernetes",
        ),
    )


def test_domain_suffix_is_a_parameter() -> None:
    (obj,) = load(REVIEWS, domain="mesh.example").objects
    assert obj.services[0].hostname == "reviews.bookinfo.svc.mesh.example"


def test_minimal_service_and_defaults() -> None:
    service = only_service(
        """
        apiVersion: v1
        kind: Service
        metadata:
          name: backend
        spec:
          ports:
          - port: 8080
        """
    )
    assert service.hostname == "backend.default.svc.cluster.local"
    assert service.namespace == "default"
    assert service.selector is None  # no selector: no managed endpoints
    assert service.addresses == ()
    assert service.ports == (ServicePort("", 8080, Protocol.UNKNOWN, None),)


def test_target_ports_number_name_or_absent() -> None:
    service = only_service(
        """
        apiVersion: v1
        kind: Service
        metadata: {name: web, namespace: shop}
        spec:
          selector: {app: web}
          ports:
          - {name: http, port: 80, targetPort: 8080}
          - {name: http-admin, port: 81, targetPort: admin-port}
          - {name: grpc, port: 90}
        """
    )
    assert [p.target_port for p in service.ports] == [8080, "admin-port", None]


def test_headless_service_has_no_address_and_no_vip_resolution() -> None:
    service = only_service(
        """
        apiVersion: v1
        kind: Service
        metadata: {name: db}
        spec:
          clusterIP: None
          selector: {app: db}
          ports: [{name: tcp-postgres, port: 5432}]
        """
    )
    assert service.addresses == ()
    assert service.resolution is Resolution.NONE


def test_dual_stack_cluster_ips_become_addresses() -> None:
    service = only_service(
        """
        apiVersion: v1
        kind: Service
        metadata: {name: web}
        spec:
          clusterIP: 10.0.0.1
          clusterIPs: [10.0.0.1, "fd00::1"]
          ipFamilyPolicy: PreferDualStack
          ports: [{port: 80, name: http}]
        """
    )
    assert service.addresses == ("10.0.0.1", "fd00::1")


def test_empty_selector_selects_nothing_but_is_not_none() -> None:
    service = only_service(
        """
        apiVersion: v1
        kind: Service
        metadata: {name: web}
        spec:
          selector: {}
          ports: [{port: 80}]
        """
    )
    assert service.selector == ()


# --- protocol detection ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "app_protocol", "expected"),
    [
        # appProtocol first (case-insensitive)
        ("web", "http", Protocol.HTTP),
        ("web", "HTTP", Protocol.HTTP),
        ("web", "http2", Protocol.HTTP2),
        ("web", "grpc", Protocol.GRPC),
        ("web", "kubernetes.io/h2c", Protocol.HTTP2),
        ("web", "kubernetes.io/ws", Protocol.HTTP),
        ("web", "tcp", Protocol.TCP),
        ("web", "https", Protocol.HTTPS),
        ("web", "TLS", Protocol.TLS),
        ("http", "tcp", Protocol.TCP),  # appProtocol wins over the name
        ("grpc", "mysql", Protocol.TCP),
        # unknown appProtocol: fall back to the port name
        ("grpc-api", "example.com/custom", Protocol.GRPC),
        # Istio port-name convention: the name or its prefix before the first '-'
        ("http", "", Protocol.HTTP),
        ("http-web", "", Protocol.HTTP),
        ("http2", "", Protocol.HTTP2),
        ("http2-api", "", Protocol.HTTP2),
        ("grpc", "", Protocol.GRPC),
        ("grpc-inventory", "", Protocol.GRPC),
        ("grpc-web", "", Protocol.HTTP),
        ("grpc-web-ui", "", Protocol.HTTP),
        ("tcp", "", Protocol.TCP),
        ("tcp-db", "", Protocol.TCP),
        ("https", "", Protocol.HTTPS),
        ("https-admin", "", Protocol.HTTPS),
        ("tls", "", Protocol.TLS),
        ("tls-passthrough", "", Protocol.TLS),
        ("mongo", "", Protocol.TCP),
        ("redis-cache", "", Protocol.TCP),
        ("mysql", "", Protocol.TCP),
        # no convention: unknown
        ("", "", Protocol.UNKNOWN),
        ("web", "", Protocol.UNKNOWN),
        ("httpx", "", Protocol.UNKNOWN),
        ("admin-http", "", Protocol.UNKNOWN),
    ],
)
def test_protocol_detection(name: str, app_protocol: str, expected: Protocol) -> None:
    port = {"port": 80}
    if name:
        port["name"] = name  # type: ignore[assignment]
    if app_protocol:
        port["appProtocol"] = app_protocol  # type: ignore[assignment]
    text = (
        "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n"
        f"spec:\n  ports:\n  - {port}\n".replace("'", '"')
    )
    (obj,) = load_text(text, "p.yaml").objects
    assert obj.services[0].ports[0].protocol is expected


# --- warnings --------------------------------------------------------------------------------


def test_udp_and_sctp_ports_are_skipped_with_a_warning() -> None:
    fc = load(
        """
        apiVersion: v1
        kind: Service
        metadata: {name: kube-dns, namespace: kube-system}
        spec:
          clusterIP: 10.96.0.10
          selector: {k8s-app: kube-dns}
          ports:
          - {name: dns, port: 53, protocol: UDP, targetPort: 53}
          - {name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}
          - {name: sig, port: 7777, protocol: SCTP}
        """
    )
    assert [p.name for p in fc.objects[0].services[0].ports] == ["dns-tcp"]
    assert messages(fc) == [
        "spec.ports[0]: protocol UDP is not supported; port 53 ignored",
        "spec.ports[2]: protocol SCTP is not supported; port 7777 ignored",
    ]
    assert str(fc.warnings[0]) == (
        "Service kube-system/kube-dns (svc.yaml:1): "
        "spec.ports[0]: protocol UDP is not supported; port 53 ignored"
    )


def test_unsupported_fields_and_types_are_warnings() -> None:
    fc = load(
        """
        apiVersion: v1
        kind: Service
        metadata: {name: web}
        spec:
          type: LoadBalancer
          selector: {app: web}
          sessionAffinity: ClientIP
          externalIPs: [1.2.3.4]
          ports:
          - {name: http, port: 80, nodePort: 30080}
        extra: true
        """
    )
    assert len(fc.objects) == 1  # still loaded
    assert messages(fc) == [
        "extra is not supported; ignored",
        "spec.type LoadBalancer is not supported; treated as ClusterIP",
        "spec.ports[0].nodePort is not supported; ignored",
        "spec.sessionAffinity ClientIP is not supported; ignored",
        "spec.externalIPs is not supported; ignored",
    ]


def test_unknown_metadata_field_is_a_warning() -> None:
    fc = load(
        """
        apiVersion: v1
        kind: Service
        metadata: {name: web, nickname: w}
        spec: {ports: [{port: 80}]}
        """
    )
    assert messages(fc) == ["metadata.nickname is not supported; ignored"]


# --- errors (with the line of the offending field) -------------------------------------------


def test_port_out_of_range() -> None:
    err = error_of(
        """
        apiVersion: v1
        kind: Service
        metadata:
          name: backend
        spec:
          ports:
          - name: http
            port: 70000
        """
    )
    assert str(err) == (
        "svc.yaml:8: Service default/backend: spec.ports[0].port: must be an integer 1-65535"
    )


@pytest.mark.parametrize(
    ("ports_yaml", "line", "message"),
    [
        ("  - name: http\n    port: '80'\n", 8, "spec.ports[0].port: must be an integer 1-65535"),
        ("  - name: http\n    port: true\n", 8, "spec.ports[0].port: must be an integer 1-65535"),
        ("  - name: http\n", 7, "spec.ports[0].port: is required"),
        (
            "  - name: http\n    port: 80\n    targetPort: 0\n",
            9,
            "spec.ports[0].targetPort: must be an integer 1-65535 or a port name",
        ),
        (
            "  - name: http\n    port: 80\n    targetPort: '8080'\n",
            9,
            "spec.ports[0].targetPort: must be an integer 1-65535 or a port name (got '8080')",
        ),
        (
            "  - name: http\n    port: 80\n    targetPort: Admin_Port\n",
            9,
            "spec.ports[0].targetPort: must be an integer 1-65535 or a port name "
            "(got 'Admin_Port')",
        ),
        (
            "  - name: http\n    port: 80\n    protocol: tcp\n",
            9,
            "spec.ports[0].protocol: must be one of TCP, UDP, SCTP (got 'tcp')",
        ),
        (
            "  - name: http\n    port: 80\n  - port: 81\n",
            9,
            "spec.ports[1].name: is required when a Service has more than one port",
        ),
        (
            "  - name: http\n    port: 80\n  - name: http\n    port: 81\n",
            9,
            "spec.ports[1].name: duplicate port name 'http' (also in spec.ports[0])",
        ),
        (
            "  - name: a\n    port: 80\n  - name: b\n    port: 80\n",
            10,
            "spec.ports[1].port: duplicate TCP port 80 (also in spec.ports[0])",
        ),
        (
            "  - name: HTTP\n    port: 80\n",
            7,
            "spec.ports[0].name: must be a DNS label: at most 63 lowercase letters, digits and "
            "'-', starting and ending with a letter or digit",
        ),
        ("  - 80\n", 7, "spec.ports[0]: must be a mapping, got a number"),
    ],
)
def test_port_errors(ports_yaml: str, line: int, message: str) -> None:
    # Lines: 1 apiVersion, 2 kind, 3 metadata, 4 name, 5 spec, 6 ports, 7... the port items.
    text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: backend\nspec:\n  ports:\n"
    with pytest.raises(ConfigError) as info:
        load_text(text + ports_yaml, "svc.yaml")
    assert str(info.value) == f"svc.yaml:{line}: Service default/backend: {message}"


@pytest.mark.parametrize(
    ("spec_yaml", "line", "message"),
    [
        (
            "  type: Headless\n",
            6,
            "spec.type: must be one of ClusterIP, NodePort, LoadBalancer, "
            "ExternalName (got 'Headless')",
        ),
        (
            "  clusterIP: 10.0.0.300\n",
            6,
            "spec.clusterIP: must be an IP address or \"None\" (got '10.0.0.300')",
        ),
        (
            "  selector:\n    app: web\n    version: 2\n",
            8,
            'spec.selector.version: label values must be strings, got a number (quote it: "2")',
        ),
        (
            "  selector:\n    app: -web\n",
            7,
            "spec.selector.app: label value '-web' is invalid: at most 63 letters, digits, '-', "
            "'_' or '.', starting and ending with a letter or digit",
        ),
        ("  selector: app=web\n", 6, "spec.selector: must be a mapping, got a string"),
        ("  ports: {name: http, port: 80}\n", 6, "spec.ports: must be a list, got a mapping"),
        (
            "  clusterIP: 10.0.0.1\n",
            5,
            "spec.ports: is required: a Service needs at least one port",
        ),
    ],
)
def test_spec_errors(spec_yaml: str, line: int, message: str) -> None:
    ports = (
        ""
        if "ports" in spec_yaml or "clusterIP: 10.0.0.1" in spec_yaml
        else ("  ports: [{name: http, port: 80}]\n")
    )
    text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n" + spec_yaml + ports
    with pytest.raises(ConfigError) as info:
        load_text(text, "svc.yaml")
    assert str(info.value) == f"svc.yaml:{line}: Service default/web: {message}"


def test_service_name_must_be_a_dns_1035_label() -> None:
    err = error_of(
        """
        apiVersion: v1
        kind: Service
        metadata:
          name: 1backend
        spec: {ports: [{port: 80}]}
        """
    )
    assert err.line == 4
    assert err.reason.startswith(
        "Service default/1backend: metadata.name: must be a DNS-1035 label"
    )


def test_spec_is_required() -> None:
    err = error_of("apiVersion: v1\nkind: Service\nmetadata: {name: web}\n")
    assert str(err) == "svc.yaml:1: Service default/web: spec: is required"


def test_headless_service_without_ports_is_fine() -> None:
    service = only_service(
        """
        apiVersion: v1
        kind: Service
        metadata: {name: peers}
        spec:
          clusterIP: None
          selector: {app: peers}
        """
    )
    assert service.ports == ()
