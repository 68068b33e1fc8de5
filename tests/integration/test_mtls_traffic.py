"""Real traffic through two real Envoys running the generated security config: auto mTLS from
a client sidecar to a server sidecar, PeerAuthentication STRICT and PERMISSIVE, the caller's
SPIFFE ID in `x-forwarded-client-cert`, and AuthorizationPolicy enforced by Envoy's RBAC.

The agent's SDS server is not part of this test: the generated resources are folded into static
bootstraps (as in test_generate_envoy_validate.py) and the SDS references to `default` and
`ROOTCA` become references to static secrets of the same names, holding certificates this test
issues with `cryptography`. Every other byte — transport socket matches, SNI, SANs, ALPN,
filter chain matches, XFCC settings, RBAC — is what the control plane generates.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from envoy.config.bootstrap.v3.bootstrap_pb2 import Bootstrap
from envoy.extensions.transport_sockets.tls.v3.secret_pb2 import Secret
from envoy.extensions.transport_sockets.tls.v3.tls_pb2 import (
    DownstreamTlsContext,
    UpstreamTlsContext,
)
from google.protobuf import json_format

from control.generate import GENERATORS
from control.generate.context import GenContext
from control.model.index import MeshIndex
from control.model.proxy import Proxy, proxy_from_node
from control.model.types import (
    AuthorizationPolicy,
    AuthzAction,
    AuthzOperation,
    AuthzRule,
    AuthzSource,
    IngressListener,
    MeshConfig,
    MtlsMode,
    PeerAuthentication,
    Protocol,
    Service,
    ServicePort,
    SidecarPort,
    SidecarScope,
    SourceRef,
    labels_of,
)
from control.xds.cache import ResourceCache
from tests.integration.test_generate_envoy_validate import static_bootstrap
from tests.support.apps import EchoApp
from tests.support.envoy import EnvoyProcess
from tests.support.net import free_port, pod_ip
from tests.support.testca import TestCA

pytestmark = pytest.mark.envoy

TRUST_DOMAIN = "cluster.local"
CLIENT_ID = f"spiffe://{TRUST_DOMAIN}/ns/shop/sa/client"
SERVER_ID = f"spiffe://{TRUST_DOMAIN}/ns/shop/sa/web"
STRICT_PORT, PERMISSIVE_PORT = 8080, 8081


# --- certificates ----------------------------------------------------------------------------


def with_static_secrets(bootstrap: Bootstrap, ca: TestCA, spiffe: str) -> Bootstrap:
    """Point the generated SDS references at static secrets with the same names."""
    for cluster in bootstrap.static_resources.clusters:
        for match in cluster.transport_socket_matches:
            upstream = UpstreamTlsContext()
            if match.transport_socket.typed_config.Unpack(upstream):
                _strip_sds(upstream.common_tls_context)
                match.transport_socket.typed_config.Pack(upstream)
    for listener in bootstrap.static_resources.listeners:
        for chain in listener.filter_chains:
            downstream = DownstreamTlsContext()
            if chain.HasField("transport_socket") and chain.transport_socket.typed_config.Unpack(
                downstream
            ):
                _strip_sds(downstream.common_tls_context)
                chain.transport_socket.typed_config.Pack(downstream)
    issued = ca.client_cert(spiffe)  # our CA's workload certificate shape: SPIFFE URI SAN
    workload = Secret(name="default")
    workload.tls_certificate.certificate_chain.inline_bytes = issued.cert_pem + ca.root_pem
    workload.tls_certificate.private_key.inline_bytes = issued.key_pem
    root = Secret(name="ROOTCA")
    root.validation_context.trusted_ca.inline_bytes = ca.root_pem
    bootstrap.static_resources.secrets.extend([workload, root])
    return bootstrap


def _strip_sds(common: Any) -> None:
    names = [c.name for c in common.tls_certificate_sds_secret_configs]
    assert names == ["default"]
    common.tls_certificate_sds_secret_configs[0].ClearField("sds_config")
    root = common.combined_validation_context.validation_context_sds_secret_config
    assert root.name == "ROOTCA" and root.sds_config.api_config_source.grpc_services
    root.ClearField("sds_config")


# --- the mesh --------------------------------------------------------------------------------


def mesh(app_port: int) -> MeshConfig:
    def svc(name: str, port: int) -> Service:
        return Service(
            hostname=f"{name}.shop.svc.cluster.local",
            namespace="shop",
            name=name,
            ports=(ServicePort("http", port, Protocol.HTTP),),
            source=SourceRef("Service", "shop", name),
            selector=labels_of({"app": "web"}),
        )

    def policy(name: str, action: AuthzAction, *rules: AuthzRule) -> AuthorizationPolicy:
        return AuthorizationPolicy(
            "shop",
            name,
            SourceRef("AuthorizationPolicy", "shop", name),
            selector=labels_of({"app": "web"}),
            action=action,
            rules=rules,
        )

    ingress = tuple(
        IngressListener(SidecarPort(port, Protocol.HTTP), default_endpoint=f"127.0.0.1:{app_port}")
        for port in (STRICT_PORT, PERMISSIVE_PORT)
    )
    return MeshConfig(
        services=(svc("web-strict", STRICT_PORT), svc("web-open", PERMISSIVE_PORT)),
        sidecars=(
            SidecarScope(
                "shop",
                "web",
                SourceRef("Sidecar", "shop", "web"),
                workload_selector=labels_of({"app": "web"}),
                ingress=ingress,
            ),
        ),
        peer_authentications=(
            PeerAuthentication(
                "shop",
                "web",
                SourceRef("PeerAuthentication", "shop", "web"),
                selector=labels_of({"app": "web"}),
                mode=MtlsMode.PERMISSIVE,
                port_modes=((STRICT_PORT, MtlsMode.STRICT),),
            ),
        ),
        authorization_policies=(
            policy(
                "deny-admin",
                AuthzAction.DENY,
                AuthzRule(operations=(AuthzOperation(paths=("/admin*",)),)),
            ),
            policy(
                "allow",
                AuthzAction.ALLOW,
                # Only the client's identity on the STRICT port ...
                AuthzRule(
                    sources=(AuthzSource(principals=(CLIENT_ID.removeprefix("spiffe://"),)),),
                    operations=(AuthzOperation(ports=(STRICT_PORT,)),),
                ),
                # ... and anyone, even plaintext, for /public on the PERMISSIVE port.
                AuthzRule(
                    operations=(AuthzOperation(ports=(PERMISSIVE_PORT,), paths=("/public*",)),)
                ),
            ),
        ),
    )


def sidecar(ip: str, name: str, app: str) -> Proxy:
    return proxy_from_node(
        f"sidecar~{ip}~{name}.shop~shop.svc.cluster.local",
        {"LABELS": {"app": app}, "SERVICE_ACCOUNT": app, "SDS": "true"},
    )


def envoy_for(
    config: MeshConfig, proxy: Proxy, others: list[Proxy], ca: TestCA, spiffe: str, workdir: Path
) -> EnvoyProcess:
    ctx = GenContext(
        MeshIndex(config, [p.as_workload() for p in [proxy, *others]]), ResourceCache()
    )
    sets = {t: gen(ctx, proxy) for t, gen in GENERATORS.items()}
    bootstrap = with_static_secrets(static_bootstrap(proxy, sets), ca, spiffe)
    data = json_format.MessageToDict(bootstrap, preserving_proto_field_name=True)
    data["admin"] = {
        "address": {"socket_address": {"address": proxy.ip, "port_value": free_port(proxy.ip)}}
    }
    return EnvoyProcess(data, workdir, name=proxy.pod_name)


@pytest.fixture
async def pods(tmp_path: Path) -> AsyncIterator[tuple[str, str, EchoApp]]:
    async with running_pods(tmp_path, SERVER_ID) as running:
        yield running


@asynccontextmanager
async def running_pods(tmp_path: Path, server_id: str) -> AsyncIterator[tuple[str, str, EchoApp]]:
    """A client sidecar and a `web` sidecar (certificate for `server_id`) in front of an app."""
    client_ip, server_ip = pod_ip(), pod_ip()
    app = EchoApp("web", "127.0.0.1", free_port())
    await app.start()
    ca = TestCA()
    client = sidecar(client_ip, "client-0", "client")
    server = sidecar(server_ip, "web-0", "web")
    config = mesh(app.port)
    envoys = [
        envoy_for(config, client, [server], ca, CLIENT_ID, tmp_path / "client"),
        envoy_for(config, server, [client], ca, server_id, tmp_path / "server"),
    ]
    try:
        for envoy in envoys:
            envoy.start()
        for envoy in envoys:

            async def live(e: EnvoyProcess = envoy) -> bool:
                status, text = await e.admin_get("/ready")
                return status == 200 and "LIVE" in text

            await envoy.wait_for(live, what="ready")
        yield client_ip, server_ip, app
    finally:
        for envoy in envoys:
            envoy.stop()
        await app.close()


async def get(
    url: str, host: str | None = None, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    hdrs = dict(headers or {})
    if host:
        hdrs["Host"] = host
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as s, s.get(url, headers=hdrs) as r:
        return r.status, await r.text()


def xfcc_of(app: EchoApp) -> str | None:
    """The x-forwarded-client-cert header of the app's last request (names are
    case-insensitive)."""
    headers = {k.lower(): v for k, v in app.headers_seen[-1].items()}
    return headers.get("x-forwarded-client-cert")


async def test_mtls_strict_permissive_xfcc_and_rbac(pods: tuple[str, str, EchoApp]) -> None:
    client_ip, server_ip, app = pods
    strict_host = "web-strict.shop.svc.cluster.local"
    open_host = "web-open.shop.svc.cluster.local"

    # Through the client's sidecar: mTLS to the STRICT port; the app learns the caller.
    status, body = await get(f"http://{client_ip}:{STRICT_PORT}/hello", strict_host)
    assert status == 200, body
    assert json.loads(body)["path"] == "/hello"
    xfcc = xfcc_of(app) or ""
    assert f"URI={CLIENT_ID}" in xfcc and f"By={SERVER_ID}" in xfcc

    # DENY wins over ALLOW, for an mTLS caller too.
    status, _ = await get(f"http://{client_ip}:{STRICT_PORT}/admin/users", strict_host)
    assert status == 403

    # STRICT: a plaintext client does not get through at all.
    seen = app.requests
    with pytest.raises((aiohttp.ClientError, asyncio.TimeoutError)):
        await get(f"http://{server_ip}:{STRICT_PORT}/hello")
    assert app.requests == seen

    # PERMISSIVE: plaintext is accepted where a policy allows it, with no identity, and a
    # forged client-cert header does not reach the app.
    forged = {"X-Forwarded-Client-Cert": f"URI={SERVER_ID}"}
    status, body = await get(f"http://{server_ip}:{PERMISSIVE_PORT}/public/x", headers=forged)
    assert status == 200, body
    assert xfcc_of(app) is None
    # ... and refused by RBAC where no ALLOW rule matches.
    status, _ = await get(f"http://{server_ip}:{PERMISSIVE_PORT}/private")
    assert status == 403

    # The mesh client on the PERMISSIVE port goes over mTLS (the app sees its identity); the
    # principal rule is for the STRICT port only, so /private is refused for it as well.
    status, _ = await get(f"http://{client_ip}:{PERMISSIVE_PORT}/public/y", open_host)
    assert status == 200
    assert f"URI={CLIENT_ID}" in (xfcc_of(app) or "")
    status, _ = await get(f"http://{client_ip}:{PERMISSIVE_PORT}/private", open_host)
    assert status == 403


async def test_client_refuses_a_server_with_another_identity(tmp_path: Path) -> None:
    """The cluster's SANs are checked: a server whose certificate (from the same root) names
    another service account is not accepted by the client sidecar."""
    impostor = f"spiffe://{TRUST_DOMAIN}/ns/shop/sa/impostor"
    async with running_pods(tmp_path, impostor) as (client_ip, _, app):
        status, _ = await get(
            f"http://{client_ip}:{STRICT_PORT}/hello", "web-strict.shop.svc.cluster.local"
        )
        assert status == 503
        assert app.requests == 0
