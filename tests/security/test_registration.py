"""Issue 18: who may register a workload. Raw ADS clients against a real control plane on
127.0.0.1 (ephemeral ports): an attacker that claims the labels of Service `alpha` must not
become one of its endpoints, and its SPIFFE ID must not join the SANs that `alpha`'s clients
accept. Only a stream authenticated as the WorkloadGroup's namespace and service account
registers, and then with the group's labels.

What each test shows fails without its guard is in the README's security notes (and the
report of the change that added them)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest

from control.app import ControlPlane
from control.ca.identity import Identity
from protos import ca_pb2, ca_pb2_grpc, typeurls
from tests.support.adsclient import AdsStream, node_id
from tests.support.controlplane import eventually, running_control_plane
from tests.support.mesh import workload_group_yaml
from tests.support.pki import ec_key, make_csr
from tests.support.traffic import service

ALPHA = "outbound|9080||alpha.default.svc.cluster.local"
ATTACKER_IP = "127.0.9.9"
MALLORY = "spiffe://cluster.local/ns/default/sa/mallory"
ALPHA_SAN = "spiffe://cluster.local/ns/default/sa/alpha"

MESH = (
    service("alpha", "alpha")
    + """\
---
"""
)

REGISTRY_LOG = "control.registry.autoregister"


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH + workload_group_yaml("alpha"))
    async with running_control_plane(cfg, grace=0.5) as cp:
        yield cp


def token(cp: ControlPlane, namespace: str, service_account: str) -> str:
    assert cp.tokens is not None
    return cp.tokens.issue(Identity(namespace, service_account), 3600, time.time())


def tls_channel(cp: ControlPlane) -> grpc.aio.Channel:
    assert cp.ca is not None
    creds = grpc.ssl_channel_credentials(root_certificates=cp.ca.root_pem.encode())
    return grpc.aio.secure_channel(f"127.0.0.1:{cp.secure_xds_port}", creds)


def attacker_node(
    namespace: str = "default", service_account: str = "mallory", group: str = "alpha"
) -> dict[str, Any]:
    """What the attacker claims: alpha's labels, an address of its choosing, a sidecar (so
    peers would use mTLS and accept its SPIFFE ID), and alpha's group."""
    meta: dict[str, Any] = {
        "NAMESPACE": namespace,
        "SERVICE_ACCOUNT": service_account,
        "LABELS": {"app": "alpha"},
        "SDS": "true",
    }
    if group:
        meta["WORKLOAD_GROUP"] = group
    return meta


async def open_stream(
    channel: grpc.aio.Channel, node: dict[str, Any], pod: str, ns: str, tok: str | None
) -> AdsStream:
    """An ADS stream from `node`; returns once the control plane answered its first request
    (the stream was admitted and its proxy connected)."""
    md = (("authorization", f"Bearer {tok}"),) if tok else None
    stream = AdsStream(channel, metadata=md)
    req = DiscoveryRequest(type_url=typeurls.CLUSTER)
    req.node.id = node_id(ATTACKER_IP, pod, ns)
    req.node.metadata.update(node)
    await stream.send(req)
    await stream.recv()
    return stream


async def alpha_view(cp: ControlPlane) -> tuple[list[str], list[str]]:
    """What a client sidecar of `alpha` is told (a fresh stream, after a push of the current
    state): the endpoint addresses of alpha's cluster and the SPIFFE IDs it accepts."""
    cp.push_now(("test",))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as channel:
        stream = AdsStream(channel)
        try:
            req = DiscoveryRequest(type_url=typeurls.CLUSTER)
            req.node.id = node_id("127.0.8.1", "client")
            req.node.metadata.update({"SDS": "true", "LABELS": {"app": "client"}})
            await stream.send(req)
            cds = await stream.recv()
            (cluster,) = [a.value for a in cds.resources if ALPHA.encode() in a.value]
            sans = sorted({m.decode() for m in re.findall(rb"spiffe://[\w./-]+", cluster)})
            eds = DiscoveryRequest(type_url=typeurls.ENDPOINT, resource_names=[ALPHA])
            eds.node.CopyFrom(req.node)
            await stream.send(eds)
            resp = await stream.recv()
            cla = ClusterLoadAssignment()
            resp.resources[0].Unpack(cla)
            addresses = [
                lb.endpoint.address.socket_address.address
                for group in cla.endpoints
                for lb in group.lb_endpoints
            ]
            return addresses, sans
        finally:
            await stream.close()


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == REGISTRY_LOG and r.levelno == logging.WARNING
    ]


def refused_metric(cp: ControlPlane, reason: str) -> float:
    value = cp.metrics.registry.get_sample_value(
        "pilotfish_auto_registrations_refused_total", {"reason": reason}
    )
    return value or 0.0


async def test_unauthenticated_stream_cannot_hijack_an_endpoint(
    cp: ControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    """Plaintext port, no credentials: a node claiming alpha's service account and group is
    not registered, nor is the issue's node (mallory, alpha's labels, no group)."""
    caplog.set_level(logging.WARNING, REGISTRY_LOG)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as channel:
        claim = attacker_node(service_account="alpha")
        named = await open_stream(channel, claim, "evil", "default", None)
        # The attack of issue 18 as it was: no group at all, just alpha's labels.
        plain = await open_stream(channel, attacker_node(group=""), "evil2", "default", None)
        try:
            addresses, sans = await alpha_view(cp)
            assert ATTACKER_IP not in addresses and addresses == []
            assert MALLORY not in sans and ALPHA_SAN not in sans
            assert cp.registry.workloads() == ()
            (warning,) = refusals(caplog)
            assert node_id(ATTACKER_IP, "evil", "default") in warning
            assert "unauthenticated" in warning
            assert refused_metric(cp, "unauthenticated") == 1
        finally:
            await named.close()
            await plain.close()


async def test_token_for_another_service_account_cannot_hijack(
    cp: ControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    """TLS port, a valid token for default/mallory, node honest about it, naming alpha's
    group: mallory is not the group's service account."""
    caplog.set_level(logging.WARNING, REGISTRY_LOG)
    async with tls_channel(cp) as channel:
        stream = await open_stream(
            channel, attacker_node(), "evil", "default", token(cp, "default", "mallory")
        )
        try:
            addresses, sans = await alpha_view(cp)
            assert addresses == [] and MALLORY not in sans
            (warning,) = refusals(caplog)
            assert node_id(ATTACKER_IP, "evil", "default") in warning
            assert "default/mallory" in warning and "default/alpha" in warning
            assert refused_metric(cp, "identity_mismatch") == 1
        finally:
            await stream.close()


async def test_identity_of_another_namespace_cannot_join_default(
    cp: ControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    """TLS port, a token for dev/alpha (alpha's service-account name in another namespace),
    naming group `alpha`, which exists only in `default`: a group is looked up in the
    proxy's own namespace, and its namespace must be the caller's."""
    caplog.set_level(logging.WARNING, REGISTRY_LOG)
    async with tls_channel(cp) as channel:
        stream = await open_stream(
            channel, attacker_node("dev", "alpha"), "evil", "dev", token(cp, "dev", "alpha")
        )
        try:
            addresses, sans = await alpha_view(cp)
            assert addresses == []
            assert "spiffe://cluster.local/ns/dev/sa/alpha" not in sans
            assert cp.registry.workloads() == ()
            (warning,) = refusals(caplog)
            assert "WorkloadGroup dev/alpha does not exist" in warning
        finally:
            await stream.close()


async def test_claiming_another_identity_on_the_tls_port_is_denied(
    cp: ControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    """TLS port, a token for default/mallory, node claiming service account alpha: the stream
    is refused with PERMISSION_DENIED before anything is registered."""
    async with tls_channel(cp) as channel:
        with pytest.raises(AssertionError, match="PERMISSION_DENIED"):
            await open_stream(
                channel,
                attacker_node(service_account="alpha"),
                "evil",
                "default",
                token(cp, "default", "mallory"),
            )
    addresses, sans = await alpha_view(cp)
    assert addresses == [] and ALPHA_SAN not in sans and MALLORY not in sans


async def test_group_member_with_matching_token_registers_with_the_groups_labels(
    cp: ControlPlane,
) -> None:
    """TLS port, a token for default/alpha and alpha's group: the same client is registered,
    with the group's labels (its own `app` claim does not override the group's), and shows
    in /debug/configz as a WorkloadEntry naming its group."""
    node = attacker_node(service_account="alpha")
    node["LABELS"] = {"app": "not-alpha", "version": "v7"}
    async with tls_channel(cp) as channel:
        stream = await open_stream(
            channel, node, "alpha-1", "default", token(cp, "default", "alpha")
        )
        try:
            addresses, sans = await alpha_view(cp)
            assert addresses == [ATTACKER_IP]
            assert sans == [ALPHA_SAN]
            (wl,) = cp.registry.workloads()
            assert dict(wl.labels) == {"app": "alpha", "version": "v7"}
            assert wl.service_account == "alpha"
            url = f"http://127.0.0.1:{cp.http_port}/debug/configz"
            async with aiohttp.ClientSession() as session, session.get(url) as r:
                (entry,) = (await r.json())["registered"]
            assert entry["kind"] == "WorkloadEntry"
            assert entry["metadata"]["name"] == f"alpha-{ATTACKER_IP}"
            assert entry["metadata"]["annotations"]["istio.io/autoRegistrationGroup"] == "alpha"
            assert entry["spec"]["labels"] == {"app": "alpha", "version": "v7"}
            assert entry["status"]["identity"] == "default/alpha"
        finally:
            await stream.close()
    # Removed a grace period after its stream closed.
    await asyncio.sleep(1.0)
    addresses, _ = await alpha_view(cp)
    assert addresses == []


async def test_plaintext_port_issues_no_certificates(cp: ControlPlane) -> None:
    """A valid token over the plaintext port buys no certificate (it could have been read off
    the wire): UNAUTHENTICATED."""
    csr = make_csr(ec_key(), san="spiffe://cluster.local/ns/default/sa/alpha")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as channel:
        stub = ca_pb2_grpc.IstioCertificateServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.CreateCertificate(
                ca_pb2.IstioCertificateRequest(csr=csr.decode(), validity_duration=600),
                metadata=[("authorization", f"Bearer {token(cp, 'default', 'alpha')}")],
            )
    assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED


async def test_deleting_the_group_removes_its_workloads(cp: ControlPlane, tmp_path: Path) -> None:
    """Registration follows the config: the group deleted, its members are no endpoints,
    though their streams stay open."""
    node = attacker_node(service_account="alpha")
    async with tls_channel(cp) as channel:
        stream = await open_stream(
            channel, node, "alpha-1", "default", token(cp, "default", "alpha")
        )
        try:
            assert (await alpha_view(cp))[0] == [ATTACKER_IP]
            (tmp_path / "cfg" / "mesh.yaml").write_text(MESH)
            await eventually(lambda: not cp.registry.workloads(), what="workload removed")
            addresses, sans = await alpha_view(cp)
            assert addresses == [] and ALPHA_SAN not in sans
        finally:
            await stream.close()


async def test_a_forged_workloads_file_registers_nothing(tmp_path: Path) -> None:
    """workloads.json in the state dir is decided again on restore: an entry in the format
    before groups (what a proxy claimed) and one whose identity is not the group's are
    dropped."""
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH + workload_group_yaml("alpha"))
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    forged = [
        {
            "proxy": node_id(ATTACKER_IP, "evil"),
            "name": "evil",
            "namespace": "default",
            "address": ATTACKER_IP,
            "labels": {"app": "alpha"},
            "service_account": "mallory",
            "has_sidecar": True,
        },
        {
            "proxy": node_id("127.0.9.10", "evil2"),
            "address": "127.0.9.10",
            "pod": "evil2",
            "namespace": "default",
            "labels": {"app": "alpha"},
            "group": "alpha",
            "identity": {"namespace": "default", "serviceAccount": "mallory"},
            "sds": True,
        },
    ]
    (state / "workloads.json").write_text(json.dumps(forged))
    async with running_control_plane(cfg, state_dir=state) as cp:
        addresses, sans = await alpha_view(cp)
        assert addresses == [] and MALLORY not in sans
