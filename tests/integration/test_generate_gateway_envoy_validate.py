"""Real Envoy (`--mode validate`) accepts what a router is generated: HTTP with redirects,
HTTPS by SNI with file and Secret certificates, MUTUAL, PASSTHROUGH, TCP, merged Gateways,
in both interception modes (tests/support/gateways.py for the manifests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from control.generate import ROUTER_GENERATORS
from control.generate.context import GenContext
from control.generate.resource_names import LISTENER_TYPE
from control.model.index import MeshIndex
from control.xds.cache import ResourceCache
from tests.integration.test_generate_envoy_validate import static_bootstrap, validate
from tests.integration.test_generate_security_envoy_validate import sds_cluster
from tests.support.gateways import GATEWAY_MESH, router
from tests.support.traffic import mesh_config
from tests.unit.test_generate_gateway import CONFLICTS

pytestmark = pytest.mark.envoy


@pytest.mark.parametrize("mode", ["NONE", "REDIRECT"])
@pytest.mark.parametrize(
    "manifests", [GATEWAY_MESH, GATEWAY_MESH + CONFLICTS], ids=["mesh", "merged"]
)
def test_envoy_accepts_router_config(tmp_path: Path, mode: str, manifests: str) -> None:
    proxy = router(mode=mode)
    ctx = GenContext(MeshIndex(mesh_config(manifests), []), ResourceCache())
    sets = {t: gen(ctx, proxy) for t, gen in ROUTER_GENERATORS.items()}
    assert len(sets[LISTENER_TYPE]) >= 5
    bootstrap = static_bootstrap(proxy, sets)
    bootstrap.static_resources.clusters.append(sds_cluster(tmp_path / "SDS"))
    result = validate(bootstrap, tmp_path / "envoy.json")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "deprecated" not in output.lower(), output
