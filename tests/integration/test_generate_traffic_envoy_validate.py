"""Real Envoy (`--mode validate`) accepts what VirtualServices and DestinationRules generate:
subsets, every load balancer, connection pools, outlier detection, TLS modes, every route
feature, weighted TCP routes (see tests/support/traffic.py for the manifests)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from control.generate import GENERATORS
from control.generate.context import GenContext
from control.generate.resource_names import CLUSTER_TYPE, ROUTE_TYPE
from control.model.index import MeshIndex
from control.model.proxy import proxy_from_node
from control.xds.cache import ResourceCache
from tests.integration.test_generate_envoy_validate import (
    mesh,
    proxies,
    static_bootstrap,
    validate,
)
from tests.support.traffic import traffic_config

pytestmark = pytest.mark.envoy


@pytest.mark.parametrize("sds", [False, True], ids=["plain", "sds"])
def test_envoy_accepts_traffic_config(tmp_path: Path, sds: bool) -> None:
    traffic = traffic_config()
    config = dataclasses.replace(
        mesh(),
        virtual_services=traffic.virtual_services,
        destination_rules=traffic.destination_rules,
    )
    all_proxies = proxies()
    if sds:
        all_proxies = [
            proxy_from_node(p.id, {"LABELS": dict(p.labels), "SDS": "true"}) for p in all_proxies
        ]
    ctx = GenContext(MeshIndex(config, [p.as_workload() for p in all_proxies]), ResourceCache())
    for i, proxy in enumerate(all_proxies):
        sets = {t: gen(ctx, proxy) for t, gen in GENERATORS.items()}
        if proxy.namespace == "default":
            assert "outbound|9080|v2|reviews.default.svc.cluster.local" in sets[CLUSTER_TYPE]
            assert "9080" in sets[ROUTE_TYPE]
        result = validate(static_bootstrap(proxy, sets), tmp_path / f"envoy-{i}.json")
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"{proxy.id}:\n{output}"
        assert "deprecated" not in output.lower(), output
