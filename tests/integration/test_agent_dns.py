"""The agent's DNS server against a running control plane: the name table arrives over NDS on
the agent stream (through the ResponseHandler registry), real queries over UDP and TCP
(dnslib and dig), forwarding to a real upstream DNS server, truncation, NACKs in syncz."""

from __future__ import annotations

import asyncio
import json
import re
import textwrap
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from google.protobuf.message import Message

from agent.app import Agent
from agent.config import AgentConfig
from control.app import ControlPlane
from protos import nds_pb2, typeurls
from tests.support.controlplane import agent_token, eventually, running_control_plane
from tests.support.dns import UpstreamDns, addresses, query, rcode, require_tool
from tests.support.mesh import root_file
from tests.support.net import free_port, pod_ip

MESH = textwrap.dedent(
    """\
    apiVersion: v1
    kind: Service
    metadata: {name: backend, namespace: default}
    spec:
      clusterIP: 10.96.0.10
      selector: {app: backend}
      ports: [{name: http, port: 9080}]
    ---
    apiVersion: v1
    kind: Service
    metadata: {name: db, namespace: shop}
    spec:
      clusterIP: 10.96.0.11
      selector: {app: db}
      ports: [{name: tcp, port: 5432}]
    ---
    apiVersion: networking.istio.io/v1
    kind: ServiceEntry
    metadata: {name: partner, namespace: default}
    spec:
      hosts: ["*.example.com", api.partner.test]
      addresses: [240.0.0.1]
      location: MESH_EXTERNAL
      resolution: NONE
      ports: [{number: 443, name: https, protocol: HTTPS}]
    """
)

EXTERNAL = {"www.outside.test": "192.0.2.77"}


@dataclass
class Pod:
    cp: ControlPlane
    agent: Agent
    ip: str
    port: int
    config: Path
    upstream: UpstreamDns

    async def ask(self, name: str, qtype: str = "A", **kw: Any) -> Any:
        return await query(self.ip, self.port, name, qtype, **kw)


def agent_config(
    cp: ControlPlane, tmp: Path, ip: str, upstreams: Sequence[str], **kw: Any
) -> AgentConfig:
    workdir = tmp / f"agent-{ip}"
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "token").write_text(agent_token(cp))
    return AgentConfig(
        # The TLS port: certificates are not issued on the plaintext one.
        control_plane=(f"127.0.0.1:{cp.secure_xds_port}",),
        ca_root_cert=root_file(cp, tmp),
        workdir=workdir,
        token_file=workdir / "token",
        ip=ip,
        pod_name="client",
        namespace="default",
        proxy_only=True,
        dns_upstream=tuple(upstreams),
        status_port=free_port(ip),
        dns_port=15053,
        **kw,
    )


async def ready(agent: Agent) -> None:
    await eventually(lambda: _is_ready(agent), timeout=15, what="agent ready")


async def _is_ready(agent: Agent) -> bool:
    return await agent.readiness() is None


@pytest.fixture(scope="module")
async def pod(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Pod]:
    tmp = tmp_path_factory.mktemp("dns")
    config = tmp / "mesh"
    config.mkdir()
    (config / "mesh.yaml").write_text(MESH)
    ip = pod_ip()
    async with UpstreamDns(ip, EXTERNAL) as upstream:
        async with running_control_plane(config) as cp:
            cfg = agent_config(cp, tmp, ip, [f"{ip}:{upstream.port}"])
            async with Agent(cfg) as agent:
                await ready(agent)
                yield Pod(cp, agent, ip, cfg.dns_port, config, upstream)


# --- names from the table --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "backend",
        "backend.default",
        "backend.default.svc",
        "backend.default.svc.cluster.local",
        "backend.default.svc.cluster.local.",
        "BACKEND.Default.SVC.cluster.local",
        "db.shop",
        "db.shop.svc",
        "db.shop.svc.cluster.local",
        "api.partner.test",
        "anything.example.com",
        "a.b.example.com",
    ],
)
async def test_every_name_form_resolves_to_the_pod_ip(pod: Pod, name: str) -> None:
    """Interception mode NONE: every mesh name answers with the pod's own IP (its outbound
    listeners are bound there), authoritatively, TTL 30."""
    for tcp in (False, True):
        reply = await pod.ask(name, tcp=tcp)
        assert rcode(reply) == "NOERROR"
        assert addresses(reply) == [pod.ip], reply
        assert reply.header.aa == 1
        assert [rr.ttl for rr in reply.rr] == [30]
        assert str(reply.rr[0].rname) == str(reply.q.qname)  # answered under the asked name


async def test_short_name_of_another_namespace_is_not_ours(pod: Pod) -> None:
    # `db` alone means db in the client's own namespace (default), which does not exist:
    # the question goes upstream, which says NXDOMAIN.
    before = pod.upstream.queries
    reply = await pod.ask("db")
    assert rcode(reply) == "NXDOMAIN"
    assert pod.upstream.queries == before + 1


async def test_search_domain_suffixed_name_is_a_cname_to_the_canonical_name(pod: Pod) -> None:
    asked = "backend.default.svc.cluster.local.default.svc.cluster.local"
    reply = await pod.ask(asked)
    assert rcode(reply) == "NOERROR"
    cname, a = reply.rr
    assert (rtype_name(cname), str(cname.rname), str(cname.rdata)) == (
        "CNAME",
        asked + ".",
        "backend.default.svc.cluster.local.",
    )
    assert (rtype_name(a), str(a.rname), str(a.rdata)) == (
        "A",
        "backend.default.svc.cluster.local.",
        pod.ip,
    )
    short = await pod.ask(
        "backend.svc.cluster.local"
    )  # `backend` + search domain svc.cluster.local
    assert [rtype_name(rr) for rr in short.rr] == ["CNAME", "A"]


def rtype_name(rr: Any) -> str:
    from dnslib import QTYPE

    return str(QTYPE.get(rr.rtype))


async def test_aaaa_for_ipv4_only_name_is_noerror_and_empty(pod: Pod) -> None:
    reply = await pod.ask("backend.default.svc.cluster.local", "AAAA")
    assert rcode(reply) == "NOERROR"
    assert reply.rr == []
    assert reply.header.aa == 1


async def test_service_added_in_yaml_resolves_within_seconds(pod: Pod) -> None:
    name = "late.default.svc.cluster.local"
    assert rcode(await pod.ask(name)) == "NXDOMAIN"  # not ours yet: upstream says so
    (pod.config / "late.yaml").write_text(
        textwrap.dedent(
            """\
            apiVersion: v1
            kind: Service
            metadata: {name: late, namespace: default}
            spec:
              clusterIP: 10.96.0.40
              selector: {app: late}
              ports: [{name: http, port: 9081}]
            """
        )
    )

    async def resolves() -> bool:
        return addresses(await pod.ask(name)) == [pod.ip]

    await eventually(resolves, timeout=3, what="late service in DNS")
    assert addresses(await pod.ask("late")) == [pod.ip]


# --- forwarding ------------------------------------------------------------------------------


async def test_unknown_name_is_answered_by_the_upstream(pod: Pod) -> None:
    for tcp in (False, True):
        reply = await pod.ask("www.outside.test", tcp=tcp)
        assert rcode(reply) == "NOERROR"
        assert addresses(reply) == ["192.0.2.77"]
        # Not our name: the upstream's answer, relayed as it was (flags, TTL).
        assert reply.header.aa == 0 and [rr.ttl for rr in reply.rr] == [60]
    # Other query types for mesh names are not the table's business either.
    assert rcode(await pod.ask("backend.default.svc.cluster.local", "MX")) == "NXDOMAIN"


async def test_upstream_failure_is_servfail(tmp_path: Path) -> None:
    """One upstream refuses (nothing listens: ICMP unreachable), one never answers (timeout);
    both end in SERVFAIL, the mesh names keep working."""
    ip = pod_ip()
    silent = __import__("socket").socket(2, 2)  # AF_INET, SOCK_DGRAM: bound, never reads
    silent.bind((ip, 0))
    try:
        config = tmp_path / "mesh"
        config.mkdir()
        (config / "mesh.yaml").write_text(MESH)
        async with running_control_plane(config) as cp:
            for upstream in (f"{ip}:{free_port(ip)}", f"{ip}:{silent.getsockname()[1]}"):
                cfg = agent_config(cp, tmp_path, ip, [upstream])
                async with Agent(cfg) as agent:
                    await ready(agent)
                    for tcp in (False, True):
                        reply = await query(ip, 15053, "www.outside.test", tcp=tcp)
                        assert rcode(reply) == "SERVFAIL", upstream
                    ok = await query(ip, 15053, "backend")
                    assert addresses(ok) == [ip]
    finally:
        silent.close()


# --- dig -------------------------------------------------------------------------------------


async def test_dig_resolves_mesh_and_upstream_names(pod: Pod) -> None:
    dig = require_tool("dig")

    async def run(*args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            dig,
            f"@{pod.ip}",
            "-p",
            str(pod.port),
            "+time=3",
            "+tries=1",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        return out.decode()

    assert (await run("+short", "backend.default.svc.cluster.local")).split() == [pod.ip]
    assert (await run("+short", "+tcp", "db.shop")).split() == [pod.ip]
    assert (await run("+short", "www.outside.test")).split() == ["192.0.2.77"]
    full = await run("backend.default.svc.cluster.local", "AAAA")
    assert "status: NOERROR" in full and "ANSWER: 0," in full, full
    assert re.search(r"flags: [^;]*\baa\b", full), full  # authoritative


# --- status server ---------------------------------------------------------------------------


async def test_ndsz_shows_the_table(pod: Pod) -> None:
    url = f"http://{pod.ip}:{pod.agent.cfg.status_port}/debug/ndsz"
    async with aiohttp.ClientSession() as session, session.get(url) as r:
        assert r.status == 200
        body = json.loads(await r.text())
    backend = body["hosts"]["backend.default.svc.cluster.local"]
    assert backend == {
        "ips": [pod.ip],
        "registry": "Kubernetes",
        "shortname": "backend",
        "namespace": "default",
    }
    assert body["hosts"]["*.example.com"]["registry"] == "External"
    assert body["alt_names"]["backend"] == "backend.default.svc.cluster.local"
    assert body["version"] >= 1


# --- REDIRECT: VIPs, big answers, truncation ------------------------------------------------


BIG = textwrap.dedent(
    """\
    apiVersion: networking.istio.io/v1
    kind: ServiceEntry
    metadata: {name: big, namespace: default}
    spec:
      hosts: [big.partner.test]
      addresses: [%s]
      location: MESH_EXTERNAL
      resolution: STATIC
      endpoints: [{address: 10.9.0.1}]
      ports: [{number: 80, name: http, protocol: HTTP}]
    """
) % ", ".join(f"240.1.0.{i}" for i in range(1, 61))


async def test_redirect_mode_answers_vips_and_truncates_big_udp_answers(tmp_path: Path) -> None:
    ip = pod_ip()
    config = tmp_path / "mesh"
    config.mkdir()
    (config / "mesh.yaml").write_text(MESH + "---\n" + BIG)
    async with running_control_plane(config) as cp:
        cfg = agent_config(cp, tmp_path, ip, [], extra_metadata={"INTERCEPTION_MODE": "REDIRECT"})
        async with Agent(cfg) as agent:
            await ready(agent)
            assert addresses(await query(ip, 15053, "backend")) == ["10.96.0.10"]
            assert addresses(await query(ip, 15053, "db.shop.svc")) == ["10.96.0.11"]
            assert addresses(await query(ip, 15053, "x.example.com")) == ["240.0.0.1"]
            # 60 addresses (~1 KB) do not fit 512 bytes: TC and no answers over UDP ...
            small = await query(ip, 15053, "big.partner.test")
            assert small.header.tc == 1 and small.rr == []
            # ... nor the 1232 bytes we allow with EDNS when the client offers more ...
            edns = await query(ip, 15053, "big.partner.test", edns=1232)
            assert edns.header.tc == 0 and len(addresses(edns)) == 60
            tiny = await query(ip, 15053, "big.partner.test", edns=600)
            assert tiny.header.tc == 1
            # ... and over TCP the whole answer comes back.
            full = await query(ip, 15053, "big.partner.test", tcp=True)
            assert full.header.tc == 0
            assert sorted(addresses(full)) == sorted(f"240.1.0.{i}" for i in range(1, 61))


# --- NACK ------------------------------------------------------------------------------------


FORBIDDEN = textwrap.dedent(
    """\
    apiVersion: networking.istio.io/v1
    kind: ServiceEntry
    metadata: {name: forbidden, namespace: default}
    spec:
      hosts: [forbidden.partner.test]
      addresses: [240.0.0.9]
      location: MESH_EXTERNAL
      resolution: NONE
      ports: [{number: 443, name: https, protocol: HTTPS}]
    """
)


def refuse_forbidden_tables(agent: Agent) -> None:
    """Plug a stricter NameTable handler into the agent's registry in place of the built-in
    one: it rejects tables naming forbidden.partner.test and hands the rest on."""
    builtin = agent.names
    assert builtin is not None

    def strict(resources: Sequence[Message]) -> None:
        for table in resources:
            assert isinstance(table, nds_pb2.NameTable)
            if "forbidden.partner.test" in table.table:
                raise ValueError("forbidden.partner.test is not allowed here")
        builtin(resources)

    agent.handlers.unregister(typeurls.NAME_TABLE)
    agent.handlers.register(typeurls.NAME_TABLE, strict)


async def test_rejected_name_table_is_a_nack_in_syncz(tmp_path: Path) -> None:
    """A stricter NameTable handler (plugged into the agent's registry in place of the built-in
    one) rejects tables naming a forbidden host: the control plane records the NACK, and the
    DNS server keeps answering from the last table it accepted."""
    ip = pod_ip()
    config = tmp_path / "mesh"
    config.mkdir()
    (config / "mesh.yaml").write_text(MESH)
    async with running_control_plane(config) as cp:
        agent = Agent(agent_config(cp, tmp_path, ip, []))
        refuse_forbidden_tables(agent)
        async with agent:
            await ready(agent)
            (config / "forbidden.yaml").write_text(FORBIDDEN)

            def nack() -> str:
                for stream in cp.views.syncz():
                    row = stream["types"].get(typeurls.NAME_TABLE)
                    if row and row["last_nack"]:
                        return str(row["last_nack"])
                return ""

            message = await eventually(nack, timeout=5, what="NDS NACK in syncz")
            assert "forbidden.partner.test is not allowed here" in message
            url = f"http://127.0.0.1:{cp.http_port}/debug/syncz"
            async with aiohttp.ClientSession() as session, session.get(url) as r:
                assert "forbidden.partner.test is not allowed here" in await r.text()
            reply = await query(ip, 15053, "forbidden.partner.test")
            assert rcode(reply) == "SERVFAIL"  # not in the accepted table; no upstream set
            assert addresses(await query(ip, 15053, "backend")) == [ip]


async def test_not_ready_until_a_name_table_is_accepted(tmp_path: Path) -> None:
    """Readiness waits for the first accepted name table: an agent whose handler rejects every
    table has its certificate and upstream channel but stays not ready, and says why; it turns
    ready once the control plane sends a table the handler takes."""
    ip = pod_ip()
    config = tmp_path / "mesh"
    config.mkdir()
    (config / "mesh.yaml").write_text(MESH)
    (config / "forbidden.yaml").write_text(FORBIDDEN)
    async with running_control_plane(config) as cp:
        agent = Agent(agent_config(cp, tmp_path, ip, []))
        refuse_forbidden_tables(agent)
        async with agent:
            await eventually(lambda: agent.secrets.ready, timeout=15, what="workload cert")

            def nacked() -> bool:
                return any(
                    (row := s["types"].get(typeurls.NAME_TABLE)) and row["last_nack"]
                    for s in cp.views.syncz()
                )

            await eventually(nacked, timeout=5, what="NDS NACK in syncz")
            assert await agent.readiness() == "no DNS name table from the control plane yet"
            (config / "forbidden.yaml").unlink()
            await ready(agent)
