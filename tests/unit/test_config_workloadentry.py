"""Istio WorkloadEntry -> model Workload (control/config/kinds/workloadentry.py)."""

from __future__ import annotations

import textwrap

import pytest

from control.config.errors import ConfigError
from control.config.loader import load_text
from control.model.types import SourceRef, Workload


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


VM = """
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata:
  name: details-vm-1
  namespace: bookinfo
spec:
  address: 127.0.1.7
  labels:
    app: details
    version: v1
    security.istio.io/tlsMode: istio
  ports:
    http: 9080
    grpc-admin: 9090
  serviceAccount: bookinfo-details
  locality: us-east1/us-east1-b
  weight: 10
"""


def test_realistic_workload_entry() -> None:
    fc = load_text(dedent(VM), "vm.yaml")
    assert fc.warnings == ()
    (obj,) = fc.objects
    source = SourceRef("WorkloadEntry", "bookinfo", "details-vm-1", "vm.yaml", 1)
    assert obj.workloads == (
        Workload(
            name="details-vm-1",
            namespace="bookinfo",
            address="127.0.1.7",
            labels=(("app", "details"), ("security.istio.io/tlsMode", "istio"), ("version", "v1")),
            service_account="bookinfo-details",
            source=source,
            ports=(("grpc-admin", 9090), ("http", 9080)),
            has_sidecar=True,
            locality="us-east1/us-east1-b",
            weight=10,
        ),
    )


@pytest.mark.parametrize("version", ["v1", "v1beta1", "v1alpha3"])
def test_api_versions(version: str) -> None:
    text = dedent(VM).replace("networking.istio.io/v1", f"networking.istio.io/{version}")
    assert len(load_text(text, "vm.yaml").objects) == 1


def test_unknown_api_version_is_ignored_with_a_warning() -> None:
    text = dedent(VM).replace("networking.istio.io/v1", "networking.istio.io/v2")
    fc = load_text(text, "vm.yaml")
    assert fc.objects == ()
    assert [str(w) for w in fc.warnings] == [
        "WorkloadEntry bookinfo/details-vm-1 (vm.yaml:1): kind WorkloadEntry "
        "(apiVersion networking.istio.io/v2) is not supported; ignored"
    ]


def test_plain_workload_entry_has_no_sidecar() -> None:
    fc = load_text(
        dedent(
            """
            apiVersion: networking.istio.io/v1beta1
            kind: WorkloadEntry
            metadata: {name: legacy-db}
            spec:
              address: db.internal.example.com
              labels: {app: db}
            """
        ),
        "we.yaml",
    )
    (wl,) = fc.objects[0].workloads
    assert wl.has_sidecar is False
    assert wl.address == "db.internal.example.com"
    assert wl.namespace == "default"
    assert (wl.service_account, wl.ports, wl.weight, wl.locality) == ("", (), 0, "")


def test_ipv6_address() -> None:
    text = "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {name: a}\n"
    fc = load_text(text + "spec: {address: 'fd00::7'}\n", "we.yaml")
    assert fc.objects[0].workloads[0].address == "fd00::7"


def test_network_and_unknown_fields_are_reported() -> None:
    text = dedent(VM) + "  network: net-west\n  healthCheck: {}\n"
    fc = load_text(text, "vm.yaml")
    assert len(fc.objects) == 1
    assert [w.message for w in fc.warnings] == [
        "spec.network 'net-west' (multi-network) is not supported; ignored",
        "spec.healthCheck is not supported; ignored",
    ]


HEADER = "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata:\n  name: vm\nspec:\n"


@pytest.mark.parametrize(
    ("spec_yaml", "line", "message"),
    [
        ("  labels: {app: x}\n", 5, "spec.address: is required"),
        (
            "  address: 10.0.0.300\n",
            6,
            "spec.address: must be an IP address or a hostname (got '10.0.0.300')",
        ),
        (
            "  address: not_a host\n",
            6,
            "spec.address: must be an IP address or a hostname (got 'not_a host')",
        ),
        ("  address: [10.0.0.1]\n", 6, "spec.address: must be a string, got a list"),
        (
            "  address: 10.0.0.1\n  ports:\n    http: 0\n",
            8,
            "spec.ports.http: must be an integer 1-65535",
        ),
        (
            "  address: 10.0.0.1\n  ports:\n    http: '80'\n",
            8,
            "spec.ports.http: must be an integer 1-65535",
        ),
        ("  address: 10.0.0.1\n  ports: [80]\n", 7, "spec.ports: must be a mapping, got a list"),
        ("  address: 10.0.0.1\n  weight: -1\n", 7, "spec.weight: must be an integer 0-4294967295"),
        (
            "  address: 10.0.0.1\n  locality: a/b/c/d\n",
            7,
            "spec.locality: must be region, region/zone or region/zone/subzone (got 'a/b/c/d')",
        ),
        (
            "  address: 10.0.0.1\n  serviceAccount: Bad_SA\n",
            7,
            "spec.serviceAccount: must be a "
            "DNS subdomain: lowercase letters, digits, '-' and '.', at most 253 characters, each "
            "part starting and ending with a letter or digit",
        ),
        (
            "  address: 10.0.0.1\n  labels:\n    app: web\n    tier: true\n",
            9,
            'spec.labels.tier: label values must be strings, got a boolean (quote it: "true")',
        ),
        (
            "  address: 10.0.0.1\n  labels:\n    /app: web\n",
            8,
            "spec.labels['/app']: label key '/app' has an invalid prefix (must be a DNS subdomain)",
        ),
    ],
)
def test_errors(spec_yaml: str, line: int, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(HEADER + spec_yaml, "we.yaml")
    assert str(info.value) == f"we.yaml:{line}: WorkloadEntry default/vm: {message}"


def test_object_name_must_be_a_dns_subdomain() -> None:
    with pytest.raises(ConfigError) as info:
        load_text(HEADER.replace("name: vm", "name: VM_1") + "  address: 1.2.3.4\n", "we.yaml")
    assert info.value.line == 4
    assert "metadata.name: must be a DNS subdomain" in info.value.reason
