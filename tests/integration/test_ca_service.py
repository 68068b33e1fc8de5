"""The CA and the TLS ports against a running control plane: real gRPC, real TLS, real
certificates. The agent side (UpstreamChannel over TLS, CaClient) is exercised here too."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import signal
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest

from agent.sds.caclient import CaClient, CaClientError
from agent.xdsproxy.agentstream import AgentStream
from agent.xdsproxy.handlers import HandlerRegistry
from agent.xdsproxy.relay import RelayStats
from agent.xdsproxy.upstream import UpstreamChannel, UpstreamTls
from control.app import ControlPlane
from control.ca.authority import in_memory_authority
from control.ca.identity import Identity
from protos import ca_pb2, ca_pb2_grpc, typeurls
from tests.integration.test_agent_xdsproxy import established_to
from tests.support.adsclient import node_id
from tests.support.controlplane import eventually, running_control_plane
from tests.support.pki import (
    cert_pem,
    ec_key,
    key_pem,
    load_chain,
    make_csr,
    spiffe_ids,
    verify_chain,
    write_intermediate_ca,
)

MESH = """\
apiVersion: v1
kind: Service
metadata: {name: alpha, namespace: default}
spec:
  selector: {app: alpha}
  ports: [{name: http, port: 9080, targetPort: 8080}]
"""

SLEEP = Identity("default", "sleep")


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    d = tmp_path / "cfg"
    d.mkdir()
    (d / "mesh.yaml").write_text(MESH)
    return d


@pytest.fixture
async def cp(cfg: Path) -> AsyncIterator[ControlPlane]:
    async with running_control_plane(cfg, mtls=True) as cp:
        yield cp


def token(cp: ControlPlane, identity: Identity = SLEEP, ttl: float = 3600) -> str:
    assert cp.tokens is not None
    return cp.tokens.issue(identity, ttl, time.time())


def root(cp: ControlPlane) -> bytes:
    assert cp.ca is not None
    return cp.ca.root_pem.encode()


def tls_channel(cp: ControlPlane, port: int, **kw: bytes) -> grpc.aio.Channel:
    return grpc.aio.secure_channel(
        f"127.0.0.1:{port}", grpc.ssl_channel_credentials(root_certificates=root(cp), **kw)
    )


async def create(
    channel: grpc.aio.Channel, csr: bytes, tok: str | None, ttl: int = 600
) -> list[x509.Certificate]:
    stub = ca_pb2_grpc.IstioCertificateServiceStub(channel)
    md = [("authorization", f"Bearer {tok}")] if tok else []
    resp = await stub.CreateCertificate(
        ca_pb2.IstioCertificateRequest(csr=csr.decode(), validity_duration=ttl), metadata=md
    )
    return load_chain(list(resp.cert_chain))


def metric(cp: ControlPlane, name: str) -> float:
    value = cp.metrics.registry.get_sample_value(name)
    return value or 0.0


async def test_csr_for_another_identity_gets_the_callers(cp: ControlPlane) -> None:
    csr = make_csr(san="spiffe://cluster.local/ns/kube-system/sa/admin", cn="admin")
    async with tls_channel(cp, cp.secure_xds_port) as plain:
        chain = await create(plain, csr, token(cp))
    assert spiffe_ids(chain[0]) == ["spiffe://cluster.local/ns/default/sa/sleep"]
    assert chain[-1].public_bytes(
        __import__(
            "cryptography.hazmat.primitives.serialization"
        ).hazmat.primitives.serialization.Encoding.PEM
    ) == root(cp)
    verify_chain(chain)
    async with tls_channel(cp, cp.secure_xds_port) as tls:
        chain = await create(tls, csr, token(cp, Identity("shop", "cart")))
    assert spiffe_ids(chain[0]) == ["spiffe://cluster.local/ns/shop/sa/cart"]
    assert metric(cp, "citadel_server_success_cert_issuance_count_total") == 2


@pytest.mark.parametrize("case", ["none", "bad-signature", "expired", "garbage"])
async def test_bad_credentials_are_unauthenticated(cp: ControlPlane, case: str) -> None:
    if case == "none":
        tok = None
    elif case == "bad-signature":
        from control.ca.authn import TokenIssuer

        tok = TokenIssuer(ec_key()).issue(SLEEP, 3600, time.time())
    elif case == "expired":
        assert cp.tokens is not None
        tok = cp.tokens.issue(SLEEP, 60, time.time() - 3600)
    else:
        tok = "not-a-token"
    async with tls_channel(cp, cp.secure_xds_port) as plain:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await create(plain, make_csr(), tok)
    assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED, e.value.details()
    assert metric(cp, "citadel_server_authentication_failure_count_total") == 1


async def test_bad_csr_is_invalid_argument(cp: ControlPlane) -> None:
    async with tls_channel(cp, cp.secure_xds_port) as plain:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await create(plain, b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n", token(cp))
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_a_killed_signing_worker_answers_unavailable_then_a_new_one_signs(
    cp: ControlPlane,
) -> None:
    """The calls the worker held when it died get UNAVAILABLE (the agent's CaClient retries
    those); the next calls are signed by its successor."""
    assert cp.ca_service is not None
    signer = cp.ca_service.signer
    async with tls_channel(cp, cp.secure_xds_port) as plain:
        await create(plain, make_csr(), token(cp))
        pid = signer.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        held = asyncio.create_task(create(plain, make_csr(), token(cp)))
        # Counted, then (in the same step of the loop) written to the stopped worker's pipe.
        await eventually(lambda: metric(cp, "citadel_server_csr_count_total") == 2)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await held
        assert e.value.code() is grpc.StatusCode.UNAVAILABLE, e.value.details()
        verify_chain(await create(plain, make_csr(), token(cp)))
    assert signer.pid not in (None, pid)
    assert metric(cp, "pilotfish_ca_signer_restarts_total") == 1
    assert metric(cp, "citadel_server_success_cert_issuance_count_total") == 2


async def test_state_dir_keys_are_private_and_the_root_survives_a_restart(
    cfg: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    async with running_control_plane(cfg, state_dir=state) as cp:
        first_root = root(cp)
        tok = token(cp)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for key in ("root-key.pem", "token-key.pem"):
        assert stat.S_IMODE((state / key).stat().st_mode) == 0o600, key
    assert (state / "root-cert.pem").read_bytes() == first_root
    async with running_control_plane(cfg, state_dir=state) as cp:
        assert root(cp) == first_root
        # A token minted before the restart is still accepted (same token key).
        async with tls_channel(cp, cp.secure_xds_port) as plain:
            chain = await create(plain, make_csr(), tok)
        assert spiffe_ids(chain[0]) == ["spiffe://cluster.local/ns/default/sa/sleep"]


async def test_plugged_in_intermediate_and_capped_validity(cfg: Path, tmp_path: Path) -> None:
    cert, key, chain_file, test_root = write_intermediate_ca(tmp_path / "pki")
    async with running_control_plane(
        cfg, ca_files=(cert, key, chain_file), max_workload_cert_ttl=300
    ) as cp:
        async with tls_channel(cp, cp.secure_xds_port) as plain:
            chain = await create(plain, make_csr(), token(cp), ttl=7 * 86400)
            short = await create(plain, make_csr(), token(cp), ttl=60)
        # The TLS port's own certificate chains to the plugged-in root too.
        async with tls_channel(cp, cp.secure_xds_port) as tls:
            await create(tls, make_csr(), token(cp))
    assert len(chain) == 3 and chain[-1] == test_root
    verify_chain(chain)
    leaf = chain[0]
    assert leaf.not_valid_after_utc - leaf.not_valid_before_utc == dt.timedelta(seconds=300)
    assert short[0].not_valid_after_utc - short[0].not_valid_before_utc == dt.timedelta(seconds=60)


def sotw_request(ns: str, sa: str) -> DiscoveryRequest:
    r = DiscoveryRequest(type_url=typeurls.CLUSTER)
    r.node.id = node_id("127.9.0.1", "p", ns)
    r.node.metadata.update({"NAMESPACE": ns, "SERVICE_ACCOUNT": sa, "AUTO_REGISTER": "false"})
    return r


async def ads_outcome(channel: grpc.aio.Channel, req: DiscoveryRequest, tok: str | None) -> str:
    """'ok' when the stream gets a response, otherwise the status code name."""
    call = channel.stream_stream(
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
        request_serializer=DiscoveryRequest.SerializeToString,
        response_deserializer=lambda b: b,
    )(metadata=[("authorization", f"Bearer {tok}")] if tok else None)
    try:
        await call.write(req)
        resp = await asyncio.wait_for(call.read(), 10)
        return "ok" if resp is not grpc.aio.EOF else "eof"
    except grpc.aio.AioRpcError as e:
        return e.code().name
    finally:
        call.cancel()


async def test_xds_on_the_tls_port_is_authenticated_and_bound_to_the_caller(
    cp: ControlPlane,
) -> None:
    async with tls_channel(cp, cp.secure_xds_port) as tls:
        assert await ads_outcome(tls, sotw_request("default", "sleep"), token(cp)) == "ok"
        assert (
            await ads_outcome(tls, sotw_request("default", "admin"), token(cp))
            == "PERMISSION_DENIED"
        )
        assert (
            await ads_outcome(tls, sotw_request("kube-system", "sleep"), token(cp))
            == "PERMISSION_DENIED"
        )
        assert await ads_outcome(tls, sotw_request("default", "sleep"), None) == "UNAUTHENTICATED"
    # The plaintext port stays open for local use and tests (it authenticates no one, so
    # it registers nothing: tests/security/test_registration.py).
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as plain:
        assert await ads_outcome(plain, sotw_request("default", "admin"), None) == "ok"
    assert (
        cp.metrics.registry.get_sample_value(
            "pilotfish_xds_auth_failures_total", {"code": "PERMISSION_DENIED"}
        )
        == 2
    )


async def test_client_certificate_authentication(cp: ControlPlane) -> None:
    key = ec_key()
    async with tls_channel(cp, cp.secure_xds_port) as plain:
        chain = await create(plain, make_csr(key), token(cp, Identity("shop", "cart")))
    chain_pem = b"".join(cert_pem(c) for c in chain[:-1])
    async with tls_channel(
        cp, cp.mtls_xds_port, private_key=key_pem(key), certificate_chain=chain_pem
    ) as mtls:
        # No token: the certificate alone names the caller.
        again = await create(mtls, make_csr(), None)
        assert spiffe_ids(again[0]) == ["spiffe://cluster.local/ns/shop/sa/cart"]
        assert await ads_outcome(mtls, sotw_request("shop", "cart"), None) == "ok"
        assert await ads_outcome(mtls, sotw_request("shop", "admin"), None) == ("PERMISSION_DENIED")
    # Without a client certificate the mTLS port does not even complete the handshake.
    async with tls_channel(cp, cp.mtls_xds_port) as anonymous:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await create(anonymous, make_csr(), token(cp))
        assert e.value.code() is grpc.StatusCode.UNAVAILABLE


async def test_agent_channel_over_tls_carries_xds_and_ca_on_one_connection(
    cp: ControlPlane, tmp_path: Path
) -> None:
    (tmp_path / "root.pem").write_bytes(root(cp))
    token_file = tmp_path / "token"
    token_file.write_text(token(cp))
    seen: list[object] = []
    handlers = HandlerRegistry()
    handlers.register(typeurls.CLUSTER, seen.append)
    upstream = UpstreamChannel(
        [f"127.0.0.1:{cp.secure_xds_port}"],
        tls=UpstreamTls(tmp_path / "root.pem", token_file),
        max_reconnect_backoff=0.5,
    )
    stream = AgentStream(
        upstream,
        handlers,
        RelayStats(),
        node_id=node_id("127.9.0.2", "agent"),
        metadata={"NAMESPACE": "default", "SERVICE_ACCOUNT": "sleep", "AUTO_REGISTER": "false"},
    )
    async with upstream:
        await stream.start()
        try:
            await eventually(lambda: seen, what="CDS over the TLS port")
            ca = CaClient(upstream, token_file)
            chain = load_chain(await ca.sign(make_csr(), 600))
            assert spiffe_ids(chain[0]) == ["spiffe://cluster.local/ns/default/sa/sleep"]
            # The token is read again for every call: a new file means a new identity.
            token_file.write_text(token(cp, Identity("default", "other")))
            chain = load_chain(await ca.sign(make_csr(), 600))
            assert spiffe_ids(chain[0]) == ["spiffe://cluster.local/ns/default/sa/other"]
            assert established_to(cp.secure_xds_port) == 1
            assert await upstream.problem() == "upstream channel is READY"
        finally:
            await stream.close()


async def test_ca_client_and_its_error_classes(cp: ControlPlane, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    (tmp_path / "root.pem").write_bytes(root(cp))
    # The plaintext port issues no certificates, whatever the token: not retryable.
    token_file.write_text(token(cp))
    async with UpstreamChannel([f"127.0.0.1:{cp.xds_port}"]) as upstream:
        with pytest.raises(CaClientError) as e:
            await CaClient(upstream, token_file).sign(make_csr(), 600)
        assert e.value.code is grpc.StatusCode.UNAUTHENTICATED and not e.value.retryable
    token_file.unlink()
    tls = UpstreamTls(tmp_path / "root.pem", token_file)
    async with UpstreamChannel([f"127.0.0.1:{cp.secure_xds_port}"], tls=tls) as upstream:
        ca = CaClient(upstream, token_file)
        with pytest.raises(CaClientError) as e:
            await ca.sign(make_csr(), 600)  # no token file yet
        assert e.value.code is grpc.StatusCode.UNAUTHENTICATED and not e.value.retryable
        assert str(token_file) in str(e.value)
        token_file.write_text(token(cp))
        chain = load_chain(await ca.sign(make_csr(), 600))
        assert spiffe_ids(chain[0]) == ["spiffe://cluster.local/ns/default/sa/sleep"]
        with pytest.raises(CaClientError) as e:
            await ca.sign(b"not a csr", 600)
        assert e.value.code is grpc.StatusCode.INVALID_ARGUMENT and not e.value.retryable
    # Nobody listening: retryable.
    async with UpstreamChannel(["127.0.0.1:1"]) as upstream:
        with pytest.raises(CaClientError) as e:
            await CaClient(upstream, token_file, timeout=2).sign(make_csr(), 600)
        assert e.value.retryable and e.value.code in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
        )


async def test_agent_refuses_a_control_plane_that_does_not_chain_to_its_root(
    cp: ControlPlane, tmp_path: Path
) -> None:
    stranger = in_memory_authority("cluster.local")
    (tmp_path / "wrong.pem").write_text(stranger.root_pem)
    token_file = tmp_path / "token"
    token_file.write_text(token(cp))
    upstream = UpstreamChannel(
        [f"127.0.0.1:{cp.secure_xds_port}"],
        tls=UpstreamTls(tmp_path / "wrong.pem", token_file),
        max_reconnect_backoff=0.5,
    )
    async with upstream:
        with pytest.raises(CaClientError) as e:
            await CaClient(upstream, token_file, timeout=5).sign(make_csr(), 600)
        assert e.value.retryable and e.value.code is grpc.StatusCode.UNAVAILABLE
        problem = await upstream.problem()
        assert "is not trusted" in problem and "wrong.pem" in problem, problem
    assert metric(cp, "citadel_server_csr_count_total") == 0  # nothing got through


async def test_agent_tls_root_file_errors_are_clear(tmp_path: Path) -> None:
    upstream = UpstreamChannel(["127.0.0.1:15012"], tls=UpstreamTls(tmp_path / "missing.pem", None))
    with pytest.raises(OSError, match=r"--ca-root-cert: cannot read .*missing\.pem"):
        await upstream.start()
    (tmp_path / "junk.pem").write_text("junk")
    upstream = UpstreamChannel(["127.0.0.1:15012"], tls=UpstreamTls(tmp_path / "junk.pem", None))
    with pytest.raises(OSError, match="holds no PEM certificate"):
        await upstream.start()
