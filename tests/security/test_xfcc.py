"""A forged `x-forwarded-client-cert` never reaches the app. Real Envoy sidecars running the
generated config (the setup of tests/integration/test_mtls_traffic.py, reused): on the
PERMISSIVE port's plaintext chain the header a client sends is removed (SANITIZE); through the
mesh, on the mTLS chain, it is replaced by the one Envoy computes from the peer certificate
(SANITIZE_SET), so an app that trusts the header learns the real caller or nobody."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration import test_mtls_traffic as mtls_traffic
from tests.integration.test_mtls_traffic import (
    CLIENT_ID,
    PERMISSIVE_PORT,
    SERVER_ID,
    get,
    running_pods,
)
from tests.support.apps import EchoApp
from tests.support.testca import TestCA

pytestmark = pytest.mark.envoy

FORGED = f"By={CLIENT_ID};Hash=00;URI=spiffe://cluster.local/ns/istio-system/sa/admin"


@dataclass
class Pods:
    client_ip: str
    server_ip: str
    app: EchoApp
    ca: TestCA  # the pods' CA, for an attacker who holds a mesh certificate of its own
    certs: Path


@pytest.fixture(scope="module")
async def pods(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Pods]:
    # running_pods makes its own CA; keep a hold of it (the module's name is looked up when
    # running_pods runs, so wrapping it there is enough).
    made: list[TestCA] = []

    def keep(*args: Any, **kw: Any) -> TestCA:
        made.append(TestCA(*args, **kw))
        return made[-1]

    tmp = tmp_path_factory.mktemp("xfcc")
    mtls_traffic.TestCA = keep  # type: ignore[assignment,misc]
    try:
        async with running_pods(tmp, SERVER_ID) as (client_ip, server_ip, app):
            mtls_traffic.TestCA = TestCA  # type: ignore[misc]
            yield Pods(client_ip, server_ip, app, made[0], tmp)
    finally:
        mtls_traffic.TestCA = TestCA  # type: ignore[misc]


def seen_xfcc(app: EchoApp) -> list[str]:
    """Every x-forwarded-client-cert value of the app's last request, any spelling."""
    return [v for k, v in app.headers_seen[-1].items() if k.lower() == "x-forwarded-client-cert"]


@pytest.mark.parametrize(
    "name", ["X-Forwarded-Client-Cert", "x-forwarded-client-cert", "X-FORWARDED-CLIENT-CERT"]
)
async def test_forged_xfcc_from_a_plaintext_client_is_stripped(pods: Pods, name: str) -> None:
    server_ip, app = pods.server_ip, pods.app
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


async def test_forged_xfcc_through_the_mesh_is_replaced(pods: Pods) -> None:
    """A mesh app forges the header towards a peer: two layers stop it, the caller's own
    outbound listener (SANITIZE, the default) and the server's mTLS chain (SANITIZE_SET)."""
    client_ip, app = pods.client_ip, pods.app
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


async def test_forged_xfcc_from_an_mtls_peer_is_replaced(pods: Pods) -> None:
    """A peer with a real mesh certificate of its own (no sidecar in front of it) talks mTLS
    to the server sidecar directly and forges the header: the mTLS chain replaces it
    (SANITIZE_SET) with the identity its certificate proves."""
    attacker = "spiffe://cluster.local/ns/shop/sa/attacker"
    cert, key = pods.ca.client_cert(attacker).write(pods.certs, "attacker")
    ctx = ssl.create_default_context(cadata=pods.ca.root_pem.decode())
    ctx.check_hostname = False  # the sidecar's certificate names a SPIFFE ID, not a host
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["istio", "http/1.1"])  # what the mTLS chain matches on
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(
            f"https://{pods.server_ip}:{PERMISSIVE_PORT}/public/direct",
            headers={"X-Forwarded-Client-Cert": FORGED},
            ssl=ctx,
        ) as r,
    ):
        assert r.status == 200, await r.text()
        assert json.loads(await r.text())["path"] == "/public/direct"
    [xfcc] = seen_xfcc(pods.app)
    assert f"By={SERVER_ID}" in xfcc and f"URI={attacker}" in xfcc
    assert "istio-system" not in xfcc and "Hash=00;" not in xfcc
