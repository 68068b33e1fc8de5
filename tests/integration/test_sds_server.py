"""The SDS server (agent/sds/server.py) over its real Unix socket with a real gRPC client:
StreamSecrets rules on the wire, pushes on rotation and file changes, FetchSecrets, and the
socket's permissions."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from envoy.extensions.transport_sockets.tls.v3.secret_pb2 import Secret
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest, DiscoveryResponse
from google.rpc.status_pb2 import Status

from agent.sds.resources import ROOT_CERT, WORKLOAD_CERT
from agent.sds.rotation import RotationPolicy
from agent.sds.secrets import SdsConfig, SecretManager
from agent.sds.server import SERVICE, SdsServer
from agent.sds.signer import SigningError
from pilotfish_common.lifecycle import Lifecycle
from protos import typeurls
from tests.support.controlplane import eventually
from tests.support.testca import TestCA

FAST = RotationPolicy(min_delay=0.2, retry_initial=0.05, retry_max=0.2, retry_jitter=0.0)


def secrets_of(resp: DiscoveryResponse) -> dict[str, Secret]:
    out = {}
    for any_ in resp.resources:
        s = Secret()
        assert any_.Unpack(s)
        out[s.name] = s
    return out


class Agent(Lifecycle):
    """A secret manager and its SDS server on `<dir>/SDS`, plus client stubs."""

    def __init__(self, directory: Path, ca: TestCA, *, ttl: float = 3600, fetch: float = 5):
        self.socket = directory / "SDS"
        self.manager = SecretManager(
            ca, SdsConfig(cert_ttl=ttl, rotation=FAST, file_poll_interval=0.05)
        )
        self.server = SdsServer(self.socket, self.manager, fetch_timeout=fetch)
        self.channel: grpc.aio.Channel | None = None

    async def start(self) -> None:
        await self.manager.start()
        await self.server.start()
        self.channel = grpc.aio.insecure_channel(f"unix:{self.socket}")

    async def close(self) -> None:
        assert self.channel is not None
        await self.channel.close()
        await self.server.close()
        await self.manager.close()

    async def fetch(self, *names: str, type_url: str = typeurls.SECRET) -> DiscoveryResponse:
        assert self.channel is not None
        call = self.channel.unary_unary(
            f"/{SERVICE}/FetchSecrets",
            request_serializer=DiscoveryRequest.SerializeToString,
            response_deserializer=DiscoveryResponse.FromString,
        )
        resp: DiscoveryResponse = await call(
            DiscoveryRequest(type_url=type_url, resource_names=names), timeout=10
        )
        return resp

    def stream(self) -> Stream:
        assert self.channel is not None
        return Stream(
            self.channel.stream_stream(
                f"/{SERVICE}/StreamSecrets",
                request_serializer=DiscoveryRequest.SerializeToString,
                response_deserializer=DiscoveryResponse.FromString,
            )()
        )


class Stream:
    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self.call = call
        self.last: DiscoveryResponse | None = None

    async def send(
        self, *names: str, ack: bool = True, nack: str = "", type_url: str = typeurls.SECRET
    ) -> None:
        req = DiscoveryRequest(type_url=type_url, resource_names=names)
        if self.last is not None and (ack or nack):
            req.response_nonce = self.last.nonce
            if not nack:
                req.version_info = self.last.version_info
        if nack:
            req.error_detail.CopyFrom(Status(code=3, message=nack))
        await self.call.write(req)

    async def recv(self, timeout: float = 15) -> DiscoveryResponse:
        resp = await asyncio.wait_for(self.call.read(), timeout)
        assert isinstance(resp, DiscoveryResponse), resp
        self.last = resp
        return resp


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Agent]:
    async with Agent(tmp_path, TestCA()) as a:
        assert await a.manager.wait_ready(10)
        yield a


async def test_socket_is_private_and_removed_on_close(tmp_path: Path) -> None:
    async with Agent(tmp_path, TestCA()) as a:
        mode = os.stat(a.socket).st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o600
        assert os.listdir(tmp_path) == ["SDS"]  # the private bind directory is gone
    assert not a.socket.exists()


async def test_stream_serves_default_and_rootca(agent: Agent) -> None:
    s = agent.stream()
    await s.send(WORKLOAD_CERT, ROOT_CERT)
    resp = await s.recv()
    assert resp.type_url == typeurls.SECRET and resp.nonce
    got = secrets_of(resp)
    assert set(got) == {WORKLOAD_CERT, ROOT_CERT}
    assert got[WORKLOAD_CERT].tls_certificate.private_key.inline_bytes.startswith(b"-----BEGIN")
    s.call.cancel()


async def test_rotation_reaches_every_stream_subscribed_to_default(agent: Agent) -> None:
    a, b, root_only = agent.stream(), agent.stream(), agent.stream()
    await a.send(WORKLOAD_CERT)
    await b.send(WORKLOAD_CERT)
    await root_only.send(ROOT_CERT)
    first = [await a.recv(), await b.recv(), await root_only.recv()]
    # ACK each.
    await a.send(WORKLOAD_CERT)
    await b.send(WORKLOAD_CERT)
    await root_only.send(ROOT_CERT)
    await eventually(lambda: agent.server.active == 3, what="three streams")
    before = agent.manager.serial
    agent.manager.rotate_now()
    pushed = [await a.recv(), await b.recv()]
    assert agent.manager.serial != before
    current = agent.manager.get(WORKLOAD_CERT)
    assert current is not None
    for old, new in zip(first, pushed, strict=False):
        assert new.version_info != old.version_info == first[0].version_info
        assert secrets_of(new)[WORKLOAD_CERT] == current.secret()
    # The root did not change, so its stream got nothing: a new name it adds is answered
    # next, with no stale re-send ahead of it.
    await root_only.send(ROOT_CERT, WORKLOAD_CERT)
    resp = await root_only.recv()
    assert set(secrets_of(resp)) == {ROOT_CERT, WORKLOAD_CERT}
    for s in (a, b, root_only):
        s.call.cancel()


async def test_nacked_secret_is_not_resent_until_it_changes(agent: Agent) -> None:
    s = agent.stream()
    await s.send(WORKLOAD_CERT)
    nacked = await s.recv()
    await s.send(WORKLOAD_CERT, nack="rejected for the test")
    # Adding a name forces an answer; had the NACKed version been re-sent, it would come
    # first.
    await s.send(WORKLOAD_CERT, ROOT_CERT, ack=False)
    resp = await s.recv()
    assert set(secrets_of(resp)) == {WORKLOAD_CERT, ROOT_CERT}
    assert resp.nonce != nacked.nonce
    await s.send(WORKLOAD_CERT, ROOT_CERT, nack="again")
    agent.manager.rotate_now()  # a change is sent despite the NACK
    resp = await s.recv()
    assert secrets_of(resp)[WORKLOAD_CERT] != secrets_of(nacked)[WORKLOAD_CERT]
    s.call.cancel()


async def test_stale_nonce_is_ignored(agent: Agent) -> None:
    s = agent.stream()
    await s.send(WORKLOAD_CERT)
    first = await s.recv()
    agent.manager.rotate_now()
    second = await s.recv()
    # A late request carrying the first nonce that also asks for ROOTCA: ignored ...
    req = DiscoveryRequest(
        type_url=typeurls.SECRET,
        resource_names=[WORKLOAD_CERT, ROOT_CERT],
        response_nonce=first.nonce,
    )
    await s.call.write(req)
    # ... so the next answer is for this (current-nonce) request, which adds ROOTCA.
    await s.send(WORKLOAD_CERT, ROOT_CERT)
    third = await s.recv()
    assert third.nonce != second.nonce
    assert set(secrets_of(third)) == {WORKLOAD_CERT, ROOT_CERT}
    s.call.cancel()


async def test_stream_waits_for_the_first_certificate(tmp_path: Path) -> None:
    ca = TestCA(failures=[SigningError("CA not up yet")] * 3)
    async with Agent(tmp_path, ca) as a:
        s = a.stream()
        await s.send(WORKLOAD_CERT)  # before the manager is ready
        resp = await s.recv()
        assert WORKLOAD_CERT in secrets_of(resp)
        assert a.manager.stats.signing_failures == 3
        s.call.cancel()


async def test_wrong_type_url_is_invalid_argument(agent: Agent) -> None:
    s = agent.stream()
    await s.send(WORKLOAD_CERT, type_url=typeurls.CLUSTER)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await s.recv()
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_file_cert_stream_is_pushed_when_the_files_change(
    agent: Agent, tmp_path: Path
) -> None:
    ca = TestCA(name="external")
    cert, key = ca.client_cert("spiffe://ext/ns/a/sa/b").write(tmp_path, "mounted")
    root = tmp_path / "mounted-root.pem"
    root.write_bytes(ca.root_pem)
    cert_name, root_name = f"file-cert:{cert}~{key}", f"file-root:{root}"
    s = agent.stream()
    await s.send(cert_name, root_name)
    got = secrets_of(await s.recv())
    assert got[cert_name].tls_certificate.certificate_chain.inline_bytes == cert.read_bytes()
    assert got[root_name].validation_context.trusted_ca.inline_bytes == ca.root_pem
    await s.send(cert_name, root_name)
    newer = ca.client_cert("spiffe://ext/ns/a/sa/b")
    newer.write(tmp_path, "mounted")
    got = secrets_of(await s.recv())
    assert got[cert_name].tls_certificate.certificate_chain.inline_bytes == newer.cert_pem
    s.call.cancel()
    # The stream's end releases the files: nothing is watched or served any more.
    await eventually(lambda: agent.manager.get(cert_name) is None, what="release")


async def test_fetch_secrets(agent: Agent, tmp_path: Path) -> None:
    resp = await agent.fetch(WORKLOAD_CERT, ROOT_CERT)
    got = secrets_of(resp)
    assert set(got) == {WORKLOAD_CERT, ROOT_CERT}
    assert resp.version_info
    cert, key = TestCA().client_cert("spiffe://x/ns/y/sa/z").write(tmp_path, "f")
    resp = await agent.fetch(f"file-cert:{cert}~{key}")
    (only,) = secrets_of(resp).values()
    assert only.tls_certificate.private_key.inline_bytes == key.read_bytes()


@pytest.mark.parametrize(
    ("names", "type_url", "code"),
    [
        (("nope",), typeurls.SECRET, grpc.StatusCode.NOT_FOUND),
        (("file-cert:/no-separator",), typeurls.SECRET, grpc.StatusCode.NOT_FOUND),
        ((), typeurls.SECRET, grpc.StatusCode.INVALID_ARGUMENT),
        ((WORKLOAD_CERT,), typeurls.CLUSTER, grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
async def test_fetch_secrets_errors(
    agent: Agent, names: tuple[str, ...], type_url: str, code: grpc.StatusCode
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await agent.fetch(*names, type_url=type_url)
    assert e.value.code() is code


async def test_fetch_of_a_missing_file_is_unavailable(tmp_path: Path) -> None:
    async with Agent(tmp_path, TestCA(), fetch=0.3) as a:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await a.fetch(f"file-root:{tmp_path / 'absent.pem'}")
        assert e.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "absent.pem" in (e.value.details() or "")


async def test_fetch_waits_for_the_first_certificate(tmp_path: Path) -> None:
    ca = TestCA(failures=[SigningError("CA not up yet")] * 2)
    async with Agent(tmp_path, ca) as a:
        resp = await a.fetch(WORKLOAD_CERT)
        assert WORKLOAD_CERT in secrets_of(resp)
