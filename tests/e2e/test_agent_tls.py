"""`pilotfish-agent` against the control plane's TLS port: it verifies the control plane's
certificate against `--ca-root-cert`, presents its token, and is ready (its first key made by
its key worker, reaped by then); given the wrong root it refuses the control plane and its
readiness says why."""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp

from control.ca.authority import in_memory_authority
from control.ca.identity import Identity
from tests.integration.test_agent_xdsproxy import established_to
from tests.integration.test_proxyless_grpc import mesh_yaml
from tests.support.agentproc import AgentProcess
from tests.support.controlplane import eventually, running_control_plane
from tests.support.net import pod_ip


async def _readiness(ip: str) -> tuple[int, str]:
    try:
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://{ip}:15020/healthz/ready") as r,
        ):
            return r.status, await r.text()
    except aiohttp.ClientError as e:
        return 0, str(e)


async def test_agent_over_tls_with_token_and_with_a_wrong_root(tmp_path: Path) -> None:
    good_ip, bad_ip = pod_ip(), pod_ip()
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(mesh_yaml(pod_ip()))
    async with running_control_plane(cfg) as cp:
        assert cp.ca is not None and cp.tokens is not None
        (tmp_path / "root.pem").write_text(cp.ca.root_pem)
        (tmp_path / "wrong.pem").write_text(in_memory_authority("cluster.local").root_pem)
        token = cp.tokens.issue(Identity("default", "sleep"), 3600, time.time())
        agents: list[AgentProcess] = []

        def start(ip: str, rootfile: str) -> None:
            workdir = tmp_path / ip
            workdir.mkdir()
            (workdir / "token").write_text(token)  # the default --token-file
            agent = AgentProcess(
                f"127.0.0.1:{cp.secure_xds_port}",
                workdir,
                ip,
                "sleep",
                "app=sleep",
                "--proxy-only",
                "--service-account",
                "sleep",
                "--ca-root-cert",
                str(tmp_path / rootfile),
            )
            agents.append(agent)
            agent.start()

        try:
            start(good_ip, "root.pem")
            await eventually(lambda: _ok(good_ip), timeout=20, what="ready over the TLS port")
            assert established_to(cp.secure_xds_port) == 1
            # Its first key and check came from the key worker (agent/sds/keyworker.py),
            # which was gone before the agent was ready: no child is left behind.
            assert "key worker (pid " in agents[0].log(), agents[0].log()[-2000:]
            assert agents[0].proc is not None
            assert _children(agents[0].proc.pid) == []
            start(bad_ip, "wrong.pem")

            async def refused() -> str | None:
                status, text = await _readiness(bad_ip)
                return text if status == 503 and "not trusted" in text else None

            reason = await eventually(refused, timeout=20, what="wrong root refused")
            assert "wrong.pem" in reason
            assert (await _readiness(good_ip))[0] == 200
        finally:
            for agent in agents:
                assert agent.terminate() == 0, agent.log()[-2000:]


def _children(pid: int) -> list[int]:
    return [
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]


async def _ok(ip: str) -> bool:
    return (await _readiness(ip))[0] == 200
