"""Services without a selector take their endpoints from EndpointSlices, as in Kubernetes:
through the Kubernetes source against the in-test API server (tests/support/kubeapi.py), into
the mesh index's endpoints (what EDS states). Services with a selector keep using pods."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from control.kube.client import from_kubeconfig
from control.kube.endpointslices import slice_endpoints
from control.kube.source import KubeSource
from control.model.index import MeshIndex
from control.model.types import MeshConfig
from tests.support.controlplane import eventually
from tests.support.kubeapi import FakeKubeApi, pod


def selectorless_service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "clusterIP": "10.96.0.20",
            "ports": [
                {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                {"name": "grpc", "port": 9090, "protocol": "TCP"},
            ],
        },
    }


def endpoint_slice(
    name: str, service: str, endpoints: list[dict[str, Any]], address_type: str = "IPv4"
) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": address_type,
        "ports": [
            {"name": "http", "port": 8081, "protocol": "TCP"},
            {"name": "grpc", "port": 9091, "protocol": "TCP"},
        ],
        "endpoints": endpoints,
    }


def eds(config: MeshConfig, hostname: str, port: int) -> set[tuple[str, int]]:
    index = MeshIndex(config)
    service = next(s for s in index.services if s.hostname == hostname)
    service_port = service.port_by_number(port)
    assert service_port is not None
    return {(e.address, e.port) for e in index.endpoints(service, service_port)}


HOST = "db.default.svc.cluster.local"


async def test_selectorless_service_endpoints_follow_its_slices(tmp_path: Path) -> None:
    async with FakeKubeApi() as api:
        api.put(selectorless_service("db"))
        api.put(
            endpoint_slice(
                "db-abc",
                "db",
                [
                    {"addresses": ["10.1.0.1"], "conditions": {"ready": True}},
                    {"addresses": ["10.1.0.2"]},  # no conditions: ready
                    {"addresses": ["10.1.0.3"], "conditions": {"ready": False}},
                ],
            )
        )
        # A slice of another service, and a pod the selector-less service must not pick up.
        api.put(endpoint_slice("other-x", "other", [{"addresses": ["10.9.9.9"]}]))
        api.put(pod("db-pod", "10.2.0.1", {"app": "db"}))
        path = tmp_path / "kubeconfig"
        path.write_text(api.kubeconfig())
        async with KubeSource(from_kubeconfig(str(path)), lambda c: None, debounce=0.02) as source:
            assert eds(source.current, HOST, 80) == {("10.1.0.1", 8081), ("10.1.0.2", 8081)}
            assert eds(source.current, HOST, 9090) == {("10.1.0.1", 9091), ("10.1.0.2", 9091)}

            # A second slice for the same service adds endpoints; an update of the first
            # (10.1.0.3 became ready) shows up too.
            api.put(endpoint_slice("db-def", "db", [{"addresses": ["10.1.0.4"]}]))
            api.put(
                endpoint_slice(
                    "db-abc",
                    "db",
                    [{"addresses": ["10.1.0.1"]}, {"addresses": ["10.1.0.3"]}],
                )
            )
            await eventually(
                lambda: (
                    eds(source.current, HOST, 80)
                    == {("10.1.0.1", 8081), ("10.1.0.3", 8081), ("10.1.0.4", 8081)}
                ),
                what="slices merged",
            )
            # Deleting a slice removes its endpoints.
            api.delete("EndpointSlice", "default", "db-abc")
            await eventually(
                lambda: eds(source.current, HOST, 80) == {("10.1.0.4", 8081)}, what="deleted"
            )
            # Given a selector, the service takes pods again and ignores its slices.
            with_selector = selectorless_service("db")
            with_selector["spec"]["selector"] = {"app": "db"}
            api.put(with_selector)
            await eventually(
                lambda: eds(source.current, HOST, 80) == {("10.2.0.1", 8080)}, what="selector"
            )


def test_slice_endpoints_take_pod_labels_and_skip_fqdn_and_udp() -> None:
    app_pod = pod("db-0", "10.1.0.1", {"app": "db", "security.istio.io/tlsMode": "istio"})
    app_pod["spec"]["serviceAccountName"] = "db"
    slices = [
        endpoint_slice(
            "a",
            "db",
            [
                {
                    "addresses": ["10.1.0.1"],
                    "targetRef": {"kind": "Pod", "name": "db-0", "namespace": "default"},
                },
                {"addresses": ["not-an-ip"]},
            ],
        ),
        endpoint_slice("b", "db", [{"addresses": ["db.example.com"]}], address_type="FQDN"),
    ]
    slices[0]["ports"].append({"name": "dns", "port": 53, "protocol": "UDP"})
    (ep,) = slice_endpoints(slices, {("default", "db-0"): app_pod})
    assert ep.address == "10.1.0.1" and ep.service_account == "db"
    assert ("security.istio.io/tlsMode", "istio") in ep.labels
    assert dict(ep.ports) == {"http": 8081, "grpc": 9091}
