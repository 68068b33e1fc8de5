"""Who a proxy is in its own Istio metrics (control/generate/telemetry_metrics.py): the tags
its loggers carry, before and after its registration reaches the index."""

from __future__ import annotations

from typing import Any

from control.config.loader import load_text
from control.config.merge import merge
from control.generate.context import GenContext
from control.generate.telemetry_metrics import workload_telemetry
from control.model.index import MeshIndex
from control.model.proxy import Proxy, proxy_from_node
from control.xds.cache import ResourceCache
from protos.telemetry import ALS_NODE_METADATA

GROUP = (
    "apiVersion: networking.istio.io/v1\nkind: WorkloadGroup\n"
    "metadata: {name: web, namespace: shop}\n"
    "spec: {metadata: {labels: {app: web, version: v2}}, template: {serviceAccount: web}}\n"
)
ENTRY = (
    "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\n"
    "metadata: {name: web-vm, namespace: shop}\n"
    "spec: {address: 10.0.0.9, labels: {app: web, version: v3}, serviceAccount: web}\n"
)


def proxy(ip: str, group: str = "") -> Proxy:
    metadata: dict[str, Any] = {
        "LABELS": {"app": "web", "version": "v1"},
        "SERVICE_ACCOUNT": "web",
        ALS_NODE_METADATA: "true",
    }
    if group:
        metadata["WORKLOAD_GROUP"] = group
    return proxy_from_node(f"sidecar~{ip}~web-1.shop~shop.svc.cluster.local", metadata)


def context(*docs: str) -> GenContext:
    return GenContext(MeshIndex(merge([load_text("---\n".join(docs), "m.yaml")])), ResourceCache())


def test_a_member_is_named_after_its_group_before_its_registration_is_indexed() -> None:
    """Regression: the first config of a WorkloadGroup member comes before its registration
    reaches the index (with the next push), and its metrics started under the pod's name
    (`web-1`), then moved to the group's (tests/e2e/test_standard_metrics.py saw both)."""
    tel = workload_telemetry(context(GROUP), proxy("10.0.0.5", group="web"))
    assert tel is not None
    assert tel.workload == "web"
    assert (tel.app, tel.version, tel.namespace) == ("web", "v1", "shop")
    assert tel.principal == "spiffe://cluster.local/ns/shop/sa/web"


def test_a_pod_without_a_group_is_named_after_the_pod() -> None:
    tel = workload_telemetry(context(GROUP), proxy("10.0.0.5"))
    assert tel is not None and tel.workload == "web-1"


def test_a_registered_workload_names_itself_and_its_labels() -> None:
    """A WorkloadEntry at the proxy's address: its name and labels, whatever the proxy
    claims."""
    tel = workload_telemetry(context(GROUP, ENTRY), proxy("10.0.0.9", group="web"))
    assert tel is not None
    assert (tel.workload, tel.version) == ("web-vm", "v3")
