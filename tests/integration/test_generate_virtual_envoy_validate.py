"""Real Envoy accepts the listeners of interception mode REDIRECT (virtualOutbound,
virtualInbound) with the rest of a REDIRECT proxy's config: every mTLS mode, both outbound
traffic policies, inbound ports from a Sidecar and from the services that select the pod."""

from __future__ import annotations

from pathlib import Path

import pytest
from envoy.config.listener.v3.listener_pb2 import Listener

from control.generate import GENERATORS
from control.generate.context import GenContext
from control.generate.listeners_redirect import VIRTUAL_INBOUND, VIRTUAL_OUTBOUND
from control.generate.resource_names import LISTENER_TYPE
from control.model.index import MeshIndex
from control.model.proxy import proxy_from_node
from control.model.types import MtlsMode
from control.xds.cache import ResourceCache
from tests.integration.test_generate_envoy_validate import static_bootstrap, unpack, validate
from tests.integration.test_generate_security_envoy_validate import sds_cluster, secured_mesh

pytestmark = pytest.mark.envoy


@pytest.mark.parametrize(
    ("app", "mode", "policy", "sds"),
    [
        ("client", MtlsMode.STRICT, "ALLOW_ANY", True),
        ("client", MtlsMode.PERMISSIVE, "REGISTRY_ONLY", True),
        ("reviews", MtlsMode.DISABLE, "ALLOW_ANY", True),
        ("reviews", MtlsMode.PERMISSIVE, "ALLOW_ANY", False),
        ("reviews", MtlsMode.STRICT, "REGISTRY_ONLY", True),
    ],
)
def test_envoy_accepts_redirect_config(
    tmp_path: Path, app: str, mode: MtlsMode, policy: str, sds: bool
) -> None:
    meta: dict[str, object] = {
        "LABELS": {"app": app},
        "INTERCEPTION_MODE": "REDIRECT",
        "SERVICE_ACCOUNT": app,
    }
    if sds:
        meta["SDS"] = "true"
    proxy = proxy_from_node(f"sidecar~127.0.1.1~{app}.default~default.svc.cluster.local", meta)
    index = MeshIndex(
        secured_mesh(mode, with_rbac=True), [proxy.as_workload()], outbound_traffic_policy=policy
    )
    sets = {t: gen(GenContext(index, ResourceCache()), proxy) for t, gen in GENERATORS.items()}
    assert sorted(sets[LISTENER_TYPE]) == [VIRTUAL_INBOUND, VIRTUAL_OUTBOUND]
    inbound = unpack(sets[LISTENER_TYPE][VIRTUAL_INBOUND].any_bytes, Listener)
    assert isinstance(inbound, Listener)
    ports = {c.filter_chain_match.destination_port.value for c in inbound.filter_chains}
    # client: its Sidecar's ingress ports (7001 would loop to itself and is skipped, as in
    # mode NONE); reviews: the target port of the reviews service.
    assert ports - {0} == ({8000, 8443, 3306, 7000} if app == "client" else {8080})
    bootstrap = static_bootstrap(proxy, sets)
    bootstrap.static_resources.clusters.append(sds_cluster(tmp_path / "SDS"))
    result = validate(bootstrap, tmp_path / "envoy.json")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "deprecated" not in output.lower(), output
