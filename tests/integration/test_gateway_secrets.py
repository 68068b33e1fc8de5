"""Gateway certificates over ADS from a real control plane (SDS over ADS, DESIGN "Gateways"):
real gRPC streams on the TLS port with real tokens, real certificates in `v1 Secret` files.

A router of the Secret's namespace gets it; a sidecar, a router of another namespace and any
stream on the plaintext port get PERMISSION_DENIED on that stream only (the proxy's other
stream goes on); rewriting the Secret pushes the new certificate to the stream holding it and
nothing to a stream holding another Secret; a missing Secret is warned about and sent once it
appears."""

from __future__ import annotations

import asyncio
import base64
import logging
from pathlib import Path

import grpc
import pytest
from envoy.extensions.transport_sockets.tls.v3.secret_pb2 import Secret
from envoy.service.discovery.v3.discovery_pb2 import (
    DeltaDiscoveryRequest,
    DiscoveryRequest,
    DiscoveryResponse,
)

from control.ca.identity import Identity
from control.kube.client import from_kubeconfig
from control.kube.source import KubeSource
from protos import typeurls
from tests.integration.test_syncz_and_debug import http_get
from tests.security.common import plain_channel, tls_channel, token
from tests.support.adsclient import AdsStream
from tests.support.controlplane import eventually, running_control_plane
from tests.support.kubeapi import FakeKubeApi
from tests.support.secrets import secret_object, secret_yaml
from tests.support.testca import IssuedCert, TestCA

EDGE = Identity("edge", "gateway")
OTHER = Identity("other", "gateway")


def _request(
    names: list[str], identity: Identity, kind: str = "router", type_url: str = typeurls.SECRET
) -> DiscoveryRequest:
    r = DiscoveryRequest(type_url=type_url, resource_names=names)
    ns = identity.namespace
    r.node.id = f"{kind}~10.1.0.1~gw-1.{ns}~{ns}.svc.cluster.local"
    r.node.metadata.update({"SERVICE_ACCOUNT": identity.service_account})
    return r


def _secrets(resp: DiscoveryResponse) -> dict[str, Secret]:
    out = {}
    for a in resp.resources:
        s = Secret()
        a.Unpack(s)
        out[s.name] = s
    return out


async def _refused(stream: AdsStream) -> grpc.aio.AioRpcError:
    async with asyncio.timeout(10):
        while await stream.responses.get() is not None:
            pass
    assert stream.error is not None, "the stream ended without an error"
    return stream.error


def _write(cfg: Path, text: str) -> None:
    tmp = cfg / ".mesh.tmp"
    tmp.write_text(text)
    tmp.replace(cfg / "mesh.yaml")


@pytest.fixture
def ca() -> TestCA:
    return TestCA()


async def _ack(
    stream: AdsStream, resp: DiscoveryResponse, names: list[str], ident: Identity
) -> None:
    ack = _request(names, ident)
    ack.ClearField("node")
    ack.version_info, ack.response_nonce = resp.version_info, resp.nonce
    await stream.send(ack)


async def test_a_router_fetches_its_namespace_secret_and_rotation_pushes_only_it(
    tmp_path: Path, ca: TestCA
) -> None:
    cfg = tmp_path / "config"
    cfg.mkdir()
    first, second, other = (ca.server_cert([f"{n}.example.com"]) for n in ("gw", "two", "x"))

    def mesh(cert: IssuedCert) -> str:
        return (
            secret_yaml("gw-cert", cert, namespace="edge", ca=ca.root_pem)
            + secret_yaml("gw-two", second, namespace="edge")
            + secret_yaml("gw-cert", other, namespace="other")
        )

    _write(cfg, mesh(first))
    async with running_control_plane(cfg) as cp:
        channel = tls_channel(cp, cp.secure_xds_port)
        md = (("authorization", f"Bearer {token(cp, EDGE)}"),)
        one = AdsStream(channel, metadata=md)
        two = AdsStream(channel, metadata=md)
        try:
            names = ["kubernetes://gw-cert", "kubernetes://gw-cert-cacert"]
            await one.send(_request(names, EDGE))
            resp = await one.recv()
            got = _secrets(resp)
            assert set(got) == set(names)
            tls = got["kubernetes://gw-cert"].tls_certificate
            assert tls.certificate_chain.inline_bytes == first.cert_pem
            assert tls.private_key.inline_bytes == first.key_pem
            ca_bytes = got["kubernetes://gw-cert-cacert"].validation_context.trusted_ca
            assert ca_bytes.inline_bytes == ca.root_pem
            await _ack(one, resp, names, EDGE)

            # The namespace-qualified name is the same Secret.
            await two.send(_request(["kubernetes://edge/gw-two"], EDGE))
            resp2 = await two.recv()
            two_secret = _secrets(resp2)["kubernetes://edge/gw-two"].tls_certificate
            assert two_secret.certificate_chain.inline_bytes == second.cert_pem
            await _ack(two, resp2, ["kubernetes://edge/gw-two"], EDGE)

            rotated = ca.server_cert(["gw.example.com"])
            _write(cfg, mesh(rotated))
            resp = await one.recv(timeout=10)
            tls = _secrets(resp)["kubernetes://gw-cert"].tls_certificate
            assert tls.certificate_chain.inline_bytes == rotated.cert_pem
            await _ack(one, resp, names, EDGE)
            # The stream holding the other Secret is not sent anything.
            await two.expect_silence(1.0)

            # /debug/configz shows the Secrets, never their contents.
            status, text = await http_get(f"http://127.0.0.1:{cp.http_port}/debug/configz")
            assert status == 200 and "<redacted>" in text and "gw-two" in text
            for pem in (rotated.key_pem, rotated.cert_pem, second.key_pem):
                assert base64.b64encode(pem).decode()[:32] not in text
                assert pem.decode()[40:80] not in text
        finally:
            await one.close()
            await two.close()
            await channel.close()


async def test_sidecars_other_namespaces_and_plaintext_get_permission_denied(
    tmp_path: Path, ca: TestCA
) -> None:
    cfg = tmp_path / "config"
    cfg.mkdir()
    _write(cfg, secret_yaml("gw-cert", ca.server_cert(["gw"]), namespace="edge"))
    async with running_control_plane(cfg) as cp:
        channel = tls_channel(cp, cp.secure_xds_port)
        plain = plain_channel(cp.xds_port)
        edge_md = (("authorization", f"Bearer {token(cp, EDGE)}"),)
        other_md = (("authorization", f"Bearer {token(cp, OTHER)}"),)
        # The sidecar's main ADS stream, open all along: a refused secret stream of the same
        # proxy must not end it.
        main = AdsStream(channel, metadata=edge_md)
        streams = [main]
        try:
            await main.send(_request([], EDGE, "sidecar", typeurls.CLUSTER))
            await main.recv()
            cases = [
                (
                    channel,
                    edge_md,
                    _request(["kubernetes://gw-cert"], EDGE, "sidecar"),
                    "only a gateway",
                ),
                (
                    channel,
                    other_md,
                    _request(["kubernetes://edge/gw-cert"], OTHER),
                    "no ReferenceGrant",
                ),
                (plain, None, _request(["kubernetes://gw-cert"], EDGE), "unauthenticated"),
            ]
            for ch, md, req, reason in cases:
                stream = AdsStream(ch, metadata=md)
                streams.append(stream)
                await stream.send(req)
                err = await _refused(stream)
                assert err.code() is grpc.StatusCode.PERMISSION_DENIED, err
                assert reason in (err.details() or ""), err.details()
            # The main stream is still served: a new subscription is answered on it.
            await main.send(_request([], EDGE, "sidecar", typeurls.ENDPOINT))
            resp = await main.recv()
            assert resp.type_url == typeurls.ENDPOINT
            assert cp.xds.connections, "the main stream was closed"
        finally:
            for s in streams:
                await s.close()
            await channel.close()
            await plain.close()


async def test_a_missing_secret_is_warned_about_and_sent_when_it_appears(
    tmp_path: Path, ca: TestCA, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = tmp_path / "config"
    cfg.mkdir()
    present = ca.server_cert(["gw"])
    _write(cfg, secret_yaml("gw-cert", present, namespace="edge"))
    caplog.set_level(logging.WARNING, logger="control.secretaccess")
    async with running_control_plane(cfg) as cp:
        channel = tls_channel(cp, cp.secure_xds_port)
        md = (("authorization", f"Bearer {token(cp, EDGE)}"),)
        good, late = AdsStream(channel, metadata=md), AdsStream(channel, metadata=md)
        try:
            await good.send(_request(["kubernetes://gw-cert"], EDGE))
            assert set(_secrets(await good.recv())) == {"kubernetes://gw-cert"}
            await late.send(_request(["kubernetes://gw-late"], EDGE))
            assert _secrets(await late.recv()) == {}  # answered: nothing of that name yet
            await eventually(
                lambda: any("kubernetes://gw-late" in r.getMessage() for r in caplog.records),
                what="missing secret warning",
            )
            assert all(r.exc_info is None for r in caplog.records)

            appeared = ca.server_cert(["late"])
            _write(
                cfg,
                secret_yaml("gw-cert", present, namespace="edge")
                + secret_yaml("gw-late", appeared, namespace="edge"),
            )
            got = _secrets(await late.recv(timeout=10))
            assert got["kubernetes://gw-late"].tls_certificate.certificate_chain.inline_bytes == (
                appeared.cert_pem
            )
        finally:
            await good.close()
            await late.close()
            await channel.close()


def _delta_request(names: list[str], identity: Identity, kind: str) -> DeltaDiscoveryRequest:
    r = DeltaDiscoveryRequest(type_url=typeurls.SECRET, resource_names_subscribe=names)
    r.node.CopyFrom(_request([], identity, kind).node)
    return r


async def test_delta_streams_are_guarded_too(tmp_path: Path, ca: TestCA) -> None:
    cfg = tmp_path / "config"
    cfg.mkdir()
    cert = ca.server_cert(["gw"])
    _write(cfg, secret_yaml("gw-cert", cert, namespace="edge"))
    async with running_control_plane(cfg) as cp:
        channel = tls_channel(cp, cp.secure_xds_port)
        md = (("authorization", f"Bearer {token(cp, EDGE)}"),)
        router = AdsStream(channel, delta=True, metadata=md)
        sidecar = AdsStream(channel, delta=True, metadata=md)
        try:
            await router.send(_delta_request(["kubernetes://gw-cert"], EDGE, "router"))
            resp = await router.recv()
            (res,) = resp.resources
            secret = Secret()
            res.resource.Unpack(secret)
            assert secret.tls_certificate.certificate_chain.inline_bytes == cert.cert_pem
            # An ACK subscribes nothing new: not refused as a wildcard.
            await router.send(
                DeltaDiscoveryRequest(type_url=typeurls.SECRET, response_nonce=resp.nonce)
            )
            # Subscribing to another namespace's Secret later is refused.
            await router.send(
                DeltaDiscoveryRequest(
                    type_url=typeurls.SECRET, resource_names_subscribe=["kubernetes://x/y"]
                )
            )
            err = await _refused(router)
            assert err.code() is grpc.StatusCode.PERMISSION_DENIED and "x/y" in (
                err.details() or ""
            )

            await sidecar.send(_delta_request(["kubernetes://gw-cert"], EDGE, "sidecar"))
            err = await _refused(sidecar)
            assert err.code() is grpc.StatusCode.PERMISSION_DENIED
        finally:
            await router.close()
            await sidecar.close()
            await channel.close()


async def test_kubernetes_secrets_other_types_are_skipped_and_a_bad_one_keeps_its_last_good(
    tmp_path: Path, ca: TestCA
) -> None:
    good = ca.server_cert(["gw"])
    async with FakeKubeApi() as api:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig())
        api.put(secret_object("gw-cert", good, namespace="edge"))
        token = secret_object("sa-token", None, secret_type="kubernetes.io/service-account-token")
        token["data"] = {"token": base64.b64encode(b"a service account token").decode()}
        api.put(token)
        opaque = secret_object("db", None, secret_type="Opaque")
        opaque["data"] = {"password": base64.b64encode(b"hunter2").decode()}
        api.put(opaque)
        source = KubeSource(from_kubeconfig(str(kubeconfig)), debounce=0.02)
        async with source:
            (secret,) = source.current.secrets
            assert (secret.namespace, secret.name, secret.cert_chain) == (
                "edge",
                "gw-cert",
                good.cert_pem,
            )
            assert source.errors == {} and source.current.warnings == ()

            # A key that does not match: an error naming the object, the good one stays.
            bad = secret_object("gw-cert", good, namespace="edge")
            bad["data"]["tls.key"] = base64.b64encode(ca.server_cert(["x"]).key_pem).decode()
            api.put(bad)
            await eventually(lambda: source.errors, what="conversion error")
            (error,) = source.errors.values()
            assert "does not belong" in str(error) and "BEGIN" not in str(error)
            assert [s.cert_chain for s in source.current.secrets] == [good.cert_pem]
