"""Istio WorkloadGroup -> model WorkloadGroup (control/config/kinds/workloadgroup.py)."""

from __future__ import annotations

import textwrap

import pytest

from control.config.errors import ConfigError
from control.config.loader import load_text
from control.config.merge import merge
from control.model.types import SourceRef
from control.model.workloadgroup import WorkloadGroup, WorkloadProbe


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


GROUP = """
apiVersion: networking.istio.io/v1
kind: WorkloadGroup
metadata:
  name: reviews
  namespace: bookinfo
spec:
  metadata:
    labels:
      app: reviews
      version: v3
    annotations:
      example.com/owner: team-a
  template:
    labels:
      app: ignored-metadata-wins
      tier: backend
    ports:
      http: 9080
    serviceAccount: bookinfo-reviews
    locality: us-east1/us-east1-b
    weight: 5
"""


def test_realistic_workload_group() -> None:
    fc = load_text(dedent(GROUP), "wg.yaml")
    assert fc.warnings == ()
    (obj,) = fc.objects
    assert obj.workload_groups == (
        WorkloadGroup(
            namespace="bookinfo",
            name="reviews",
            source=SourceRef("WorkloadGroup", "bookinfo", "reviews", "wg.yaml", 1),
            labels=(("app", "reviews"), ("tier", "backend"), ("version", "v3")),
            annotations=(("example.com/owner", "team-a"),),
            service_account="bookinfo-reviews",
            ports=(("http", 9080),),
            locality="us-east1/us-east1-b",
            weight=5,
        ),
    )
    assert merge([fc]).workload_groups == obj.workload_groups


@pytest.mark.parametrize("version", ["v1", "v1beta1", "v1alpha3"])
def test_api_versions(version: str) -> None:
    text = dedent(GROUP).replace("networking.istio.io/v1", f"networking.istio.io/{version}")
    assert len(load_text(text, "wg.yaml").objects[0].workload_groups) == 1


def test_minimal_group_defaults_to_the_default_service_account() -> None:
    text = "apiVersion: networking.istio.io/v1\nkind: WorkloadGroup\nmetadata: {name: g}\n"
    (group,) = load_text(text + "spec: {template: {}}\n", "wg.yaml").objects[0].workload_groups
    assert (group.namespace, group.service_account, group.labels) == ("default", "default", ())


def test_probe_is_parsed_and_run_kinds_are_not_warned_about() -> None:
    text = dedent(GROUP) + (
        "  probe:\n"
        "    periodSeconds: 5\n"
        "    httpGet:\n"
        "      path: /ready\n"
        "      port: 9080\n"
        '      httpHeaders: [{name: x-probe, value: "1"}]\n'
    )
    fc = load_text(text, "wg.yaml")
    (group,) = fc.objects[0].workload_groups
    assert group.probe == WorkloadProbe(
        "httpGet",
        port=9080,
        path="/ready",
        scheme="HTTP",
        headers=(("x-probe", "1"),),
        period_seconds=5,
    )
    assert [str(w) for w in fc.warnings] == []


def test_exec_probe_is_reported_as_not_run() -> None:
    text = dedent(GROUP) + "  probe:\n    exec: {command: [cat, /ready]}\n"
    fc = load_text(text, "wg.yaml")
    (group,) = fc.objects[0].workload_groups
    assert group.probe is not None and group.probe.command == ("cat", "/ready")
    assert [str(w) for w in fc.warnings] == [
        "WorkloadGroup bookinfo/reviews (wg.yaml:1): spec.probe (exec probes are not run: "
        "members count as healthy) is not supported; ignored"
    ]


def test_network_and_unknown_fields_are_reported() -> None:
    text = dedent(GROUP) + "    network: net-west\n  healthCheck: {}\n"
    fc = load_text(text, "wg.yaml")
    assert [w.message for w in fc.warnings] == [
        "spec.template.network 'net-west' (multi-network) is not supported; ignored",
        "spec.healthCheck is not supported; ignored",
    ]


HEADER = "apiVersion: networking.istio.io/v1\nkind: WorkloadGroup\nmetadata:\n  name: g\nspec:\n"


@pytest.mark.parametrize(
    ("spec_yaml", "line", "message"),
    [
        ("  metadata: {}\n", 5, "spec.template: is required"),
        ("  template:\n    address: 10.0.0.1\n", 7, "must not be set in a WorkloadGroup"),
        ("  template:\n    serviceAccount: Bad_SA\n", 7, "spec.template.serviceAccount"),
        ("  template:\n    ports: {http: 0}\n", 7, "spec.template.ports.http"),
        ("  template: {}\n  probe: {periodSeconds: 1}\n", 7, "exactly one of httpGet"),
        (
            "  template: {}\n  probe:\n    tcpSocket: {port: 1}\n    exec: {command: [x]}\n",
            7,
            "exactly one of",
        ),
        ("  template: {}\n  probe:\n    tcpSocket: {host: a}\n", 8, "spec.probe.tcpSocket.port"),
        ("  template: {}\n  probe:\n    exec: {}\n", 8, "spec.probe.exec.command"),
        ("  template: {}\n  probe:\n    httpGet: {port: 80, scheme: FTP}\n", 8, "scheme"),
    ],
)
def test_invalid_groups_are_rejected_with_file_and_line(
    spec_yaml: str, line: int, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_text(HEADER + spec_yaml, "wg.yaml")
    text = str(err.value)
    assert text.startswith(f"wg.yaml:{line}: WorkloadGroup default/g: "), text
    assert message in text
