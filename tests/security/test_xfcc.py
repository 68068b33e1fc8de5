"""A forged `x-forwarded-client-cert` never reaches the app. Real Envoy sidecars running the
generated config (the setup of tests/integration/test_mtls_traffic.py, reused): on the
PERMISSIVE port's plaintext chain the header a client sends is removed (SANITIZE); through the
mesh, on the mTLS chain, it is replaced by the one Envoy computes from the peer certificate
(SANITIZE_SET), so an app that trusts the header learns the real caller or nobody."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from tests.integration.test_mtls_traffic import (
    CLIENT_ID,
    PERMISSIVE_PORT,
    SERVER_ID,
    get,
    running_pods,
)
from tests.support.apps import EchoApp

pytestmark = pytest.mark.envoy

FORGED = f"By={CLIENT_ID};Hash=00;URI=spiffe://cluster.local/ns/istio-system/sa/admin"


@pytest.fixture(scope="module")
async def pods(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[str, str, EchoApp]]:
    async with running_pods(tmp_path_factory.mktemp("xfcc"), SERVER_ID) as running:
        yield running


def seen_xfcc(app: EchoApp) -> list[str]:
    """Every x-forwarded-client-cert value of the app's last request, any spelling."""
    return [v for k, v in app.headers_seen[-1].items() if k.lower() == "x-forwarded-client-cert"]


@pytest.mark.parametrize(
    "name", ["X-Forwarded-Client-Cert", "x-forwarded-client-cert", "X-FORWARDED-CLIENT-CERT"]
)
async def test_forged_xfcc_from_a_plaintext_client_is_stripped(
    pods: tuple[str, str, EchoApp], name: str
) -> None:
    _, server_ip, app = pods
    seen = app.requests
    status, body = await get(
        f"http://{server_ip}:{PERMISSIVE_PORT}/public/forged", headers={name: FORGED}
    )
    # The request reached the app (a plaintext caller is allowed on /public) ...
    assert status == 200, body
    assert app.requests == seen + 1
    assert json.loads(body)["path"] == "/public/forged"
    # ... without the header.
    assert seen_xfcc(app) == []


async def test_forged_xfcc_through_the_mesh_is_replaced(pods: tuple[str, str, EchoApp]) -> None:
    """A mesh app forges the header towards a peer: two layers stop it, the caller's own
    outbound listener (SANITIZE, the default) and the server's mTLS chain (SANITIZE_SET)."""
    client_ip, _, app = pods
    status, body = await get(
        f"http://{client_ip}:{PERMISSIVE_PORT}/public/via-mesh",
        "web-open.shop.svc.cluster.local",
        headers={"X-Forwarded-Client-Cert": FORGED},
    )
    assert status == 200, body
    assert json.loads(body)["path"] == "/public/via-mesh"
    [xfcc] = seen_xfcc(app)
    # Envoy's own view of the peer, and nothing of the forged value.
    assert f"By={SERVER_ID}" in xfcc and f"URI={CLIENT_ID}" in xfcc
    assert "istio-system" not in xfcc and "Hash=00;" not in xfcc
