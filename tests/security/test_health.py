"""Issue 18: who may change a registered workload's health. Raw ADS clients against a real
control plane (TLS port, tokens): `alpha`'s WorkloadGroup has a probe, so its member serves
only while its own agent reports it healthy. A report on any other stream — another service
account's token, even with the member's very node (same IP and pod), or the plaintext port —
must neither put the member into EDS nor take it out.

Each test fails without its guard: the registry looks a report up by the reporting stream's
(proxy, identity) key and only for an admitted entry (`WorkloadRegistry.report_health`);
with the identity dropped from that lookup, mallory's reports land on alpha's entry."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest

from control.app import ControlPlane
from protos import typeurls
from tests.security.test_registration import (
    ATTACKER_IP,
    MESH,
    alpha_view,
    attacker_node,
    open_stream,
    tls_channel,
    token,
)
from tests.support.adsclient import AdsStream, node_id
from tests.support.controlplane import eventually, running_control_plane
from tests.support.mesh import workload_group_yaml

POD = "alpha-1"
PROBE = "  probe:\n    httpGet: {path: /ready, port: 8080}\n"


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH + workload_group_yaml("alpha") + PROBE)
    async with running_control_plane(cfg, grace=0.5) as cp:
        yield cp


async def report(stream: AdsStream, error: str | None, *, claim: str = "") -> None:
    """Send a health report and wait until the control plane has read it: requests on one
    stream are handled in order, so the answer to a later LDS request comes after it.
    `claim`: a node id the report names (the server must ignore it)."""
    req = DiscoveryRequest(type_url=typeurls.HEALTH)
    if claim:
        req.node.id = claim
    if error is not None:
        req.error_detail.code = 14
        req.error_detail.message = error
    await stream.send(req)
    await stream.send(DiscoveryRequest(type_url=typeurls.LISTENER))
    while (type_url := (await stream.recv(timeout=20)).type_url) != typeurls.LISTENER:
        assert type_url != typeurls.HEALTH, "a health report is never answered"


async def member(channel: grpc.aio.Channel, cp: ControlPlane) -> AdsStream:
    """alpha's member: its own token, its group; registered but not yet reported."""
    return await open_stream(
        channel,
        attacker_node(service_account="alpha"),
        POD,
        "default",
        token(cp, "default", "alpha"),
    )


async def mallory(channel: grpc.aio.Channel, cp: ControlPlane) -> AdsStream:
    """Mallory: a valid token of default/mallory, honest about it, but the member's own
    address and pod (the same proxy id) and group."""
    return await open_stream(
        channel, attacker_node(), POD, "default", token(cp, "default", "mallory")
    )


async def serving(cp: ControlPlane) -> list[str]:
    addresses, _ = await alpha_view(cp)
    return addresses


async def test_member_serves_after_its_own_healthy_report(cp: ControlPlane) -> None:
    """The baseline the attacks are measured against: registered, out of EDS until its own
    report says healthy, out again on its own unhealthy report."""
    async with tls_channel(cp) as channel:
        stream = await member(channel, cp)
        try:
            assert await serving(cp) == []
            (entry,) = cp.registry.workload_entries()
            assert entry["status"]["connected"] and not entry["status"]["serving"]
            await report(stream, None)
            assert await serving(cp) == [ATTACKER_IP]
            await report(stream, "HTTP GET: status 500")
            assert await serving(cp) == []
        finally:
            await stream.close()


async def test_another_identity_cannot_make_the_member_healthy(cp: ControlPlane) -> None:
    async with tls_channel(cp) as channel:
        victim = await member(channel, cp)
        attacker = await mallory(channel, cp)
        try:
            await report(attacker, None, claim=node_id(ATTACKER_IP, POD, "default"))
            assert await serving(cp) == []
            assert cp.registry.workloads() == ()
            (entry,) = cp.registry.workload_entries()
            assert "conditions" not in entry["status"]
        finally:
            await attacker.close()
            await victim.close()


async def test_another_identity_cannot_take_the_member_out(cp: ControlPlane) -> None:
    async with tls_channel(cp) as channel:
        victim = await member(channel, cp)
        attacker = await mallory(channel, cp)
        try:
            await report(victim, None)
            await eventually(lambda: cp.registry.workloads(), 20, what="member serving")
            await report(attacker, "forged: down", claim=node_id(ATTACKER_IP, POD, "default"))
            assert await serving(cp) == [ATTACKER_IP]
            (entry,) = cp.registry.workload_entries()
            (cond,) = entry["status"]["conditions"]
            assert cond["status"] == "True" and "forged" not in str(cond)
        finally:
            await attacker.close()
            await victim.close()


async def test_the_plaintext_port_cannot_change_health(cp: ControlPlane) -> None:
    """A plaintext stream claiming the member's whole node (its service account too):
    unauthenticated, so its reports count for nothing either way."""
    async with tls_channel(cp) as channel:
        victim = await member(channel, cp)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as plain:
                claim = attacker_node(service_account="alpha")
                forged = await open_stream(plain, claim, POD, "default", None)
                try:
                    await report(forged, None)
                    assert await serving(cp) == []
                    await report(victim, None)
                    assert await serving(cp) == [ATTACKER_IP]
                    await report(forged, "forged: down")
                    assert await serving(cp) == [ATTACKER_IP]
                finally:
                    await forged.close()
        finally:
            await victim.close()
