"""Dual-stack pods (tests/support/netns.py with ULA addresses): `pilotfish-agent iptables`
installs the ip6tables half of the capture next to the IPv4 one (what --dry-run prints is what
is installed; --cleanup removes exactly it), and HTTP from a client pod to a backend pod runs
over IPv6 through both sidecars: captured on both sides ([::]:15001, [::]:15006), mTLS
(STRICT) with the client's SPIFFE identity, and the backend's AuthorizationPolicy; DNS to an
IPv6 resolver is captured to the agent."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from pathlib import Path

import pytest

from tests.e2e.test_redirect_pods import (  # noqa: F401 (workdirs: a fixture)
    _alive,
    _by_chain,
    envoy_stat,
    ready,
    start_sidecar,
    workdirs,
)
from tests.support.agentproc import AgentProcess
from tests.support.controlplane import eventually, running_control_plane
from tests.support.iptables import nat_lines
from tests.support.mesh import workload_group_yaml
from tests.support.netns import Pod, pod_network

pytestmark = pytest.mark.envoy

HOST = "backend.default.svc.cluster.local:9080"
MESH = textwrap.dedent(
    """\
    apiVersion: v1
    kind: Service
    metadata: {name: backend, namespace: default}
    spec:
      clusterIP: 10.96.0.60
      selector: {app: backend}
      ports: [{name: http, port: 9080, targetPort: 9080}]
    ---
    apiVersion: security.istio.io/v1
    kind: PeerAuthentication
    metadata: {name: default, namespace: istio-system}
    spec:
      mtls: {mode: STRICT}
    ---
    apiVersion: security.istio.io/v1
    kind: AuthorizationPolicy
    metadata: {name: backend, namespace: default}
    spec:
      selector: {matchLabels: {app: backend}}
      action: ALLOW
      rules:
        - from: [{source: {principals: [cluster.local/ns/default/sa/client]}}]
          to: [{operation: {paths: [/ok]}}]
    ---
    """
) + workload_group_yaml("backend")


async def app_get(pod: Pod, url: str, host: str = "") -> tuple[int, dict[str, str] | str]:
    argv = [sys.executable, "-m", "tests.support.podapp", "get", url] + ([host] if host else [])
    out = await asyncio.to_thread(pod.run, *argv, timeout=30)
    text = out.stdout.strip()
    status, _, body = text.partition(" ")
    if not status.isdigit():
        return 0, text + out.stderr
    try:
        return int(status), json.loads(body)
    except ValueError:
        return int(status), body


def save6(pod: Pod) -> list[str]:
    return nat_lines(pod.run("ip6tables-save", "-t", "nat", check=True).stdout)


def save4(pod: Pod) -> list[str]:
    return nat_lines(pod.run("iptables-save", "-t", "nat", check=True).stdout)


async def test_ip6tables_dry_run_matches_installed_and_cleanup_restores() -> None:
    with pod_network(ipv6=True) as net:
        pod = net.add_pod("rules6")
        flags = (
            "--exclude-outbound-ip-ranges",
            "10.0.0.0/8,fd00:10::/64",
            "--include-inbound-ports",
            "9080",
        )
        agent = (sys.executable, "-m", "agent", "iptables", *flags)
        before4, before6 = save4(pod), save6(pod)
        dry = pod.run(*agent, "--dry-run", check=True).stdout.splitlines()
        # Two scripts: IPv4, then IPv6 after its comment line.
        split = dry.index("# ip6tables")
        dry4, dry6 = dry[:split], dry[split + 1 :]
        assert dry6[0] == "*nat" and dry6[-1] == "COMMIT"
        assert "-A PILOTFISH_OUTPUT -d ::1/128 -j RETURN" in dry6
        assert "-A PILOTFISH_OUTPUT -d fd00:10::/64 -j RETURN" in dry6
        assert not any("10.0.0.0/8" in line for line in dry6)
        done = pod.run(*agent, check=True)
        assert "IPv4 and IPv6" in done.stdout
        added6 = [line for line in save6(pod) if line not in before6]
        added4 = [line for line in save4(pod) if line not in before4]
        assert _by_chain(added6) == _by_chain(dry6[1:-1])
        assert _by_chain(added4) == _by_chain(dry4[1:-1])
        # Again: replaced, not doubled; cleanup removes exactly what was added, both tables.
        pod.run(*agent, check=True)
        assert len(save6(pod)) == len(before6) + len(added6)
        assert "removed" in pod.run(*agent[:4], "--cleanup", check=True).stdout
        assert save6(pod) == before6 and save4(pod) == before4
        # --ipv6 off: IPv4 only.
        pod.run(*agent, "--ipv6", "off", check=True)
        assert save6(pod) == before6 and save4(pod) != before4
        pod.run(*agent[:4], "--cleanup", check=True)
        assert save4(pod) == before4


async def test_dual_stack_pods_http_over_ipv6_with_mtls_and_authz(
    tmp_path: Path,
    workdirs: Path,  # noqa: F811
) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    agents: list[AgentProcess] = []
    with pod_network(ipv6=True) as net:
        client, backend, plain = net.add_pod("client"), net.add_pod("backend"), net.add_pod("plain")
        backend.spawn(
            backend.python("-m", "tests.support.podapp", "serve", "backend", "9080", "dual"),
            tmp_path / "backend-app.log",
        )
        async with running_control_plane(cfg, host=net.gateway) as cp:
            # The client's resolver is IPv6 (nothing listens there): DNS capture over IPv6 is
            # what lets its app resolve mesh names at all.
            resolv = Path("/etc/netns") / client.netns / "resolv.conf"
            resolv.write_text(resolv.read_text().replace(net.gateway, net.gateway6))
            try:
                # The backend lists its IPv6 address first (an IPv6-primary dual-stack pod):
                # that is its endpoint, so the client's sidecar reaches it over IPv6.
                for pod, app, group, ips in (
                    (client, "client", "", f"{client.ip},{client.ip6}"),
                    (backend, "backend", "backend", f"{backend.ip6},{backend.ip}"),
                ):
                    agent = start_sidecar(
                        pod,
                        cp,
                        net.gateway,
                        workdirs,
                        tmp_path,
                        app,
                        group,
                        capture=("--capture-dns",),
                        env={"INSTANCE_IPS": ips},
                    )
                    agents.append(agent)
                for pod, agent in zip((client, backend), agents, strict=True):
                    await eventually(
                        lambda pod=pod, agent=agent: _alive(agent) and ready(pod),
                        timeout=60,
                        what=f"{pod.name} ready",
                    )
                # The app dials an IPv6 address; its sidecar routes by Host to the backend.
                url = f"http://[{backend.ip6}]:9080/ok"

                async def through() -> tuple[int, object] | None:
                    result = await app_get(client, url, HOST)
                    return result if result[0] == 200 else None

                _, body = await eventually(through, timeout=30, what="client -> backend over IPv6")
                assert isinstance(body, dict) and body["app"] == "backend"
                assert "URI=spiffe://cluster.local/ns/default/sa/client" in body["xfcc"], body
                # The backend's sidecar reached the app over IPv6: the backend end was IPv6 too.
                assert ":" in body["peer"] and not body["peer"].startswith("::ffff:"), body
                # Captured once on each side, on the listeners' IPv6 addresses.
                assert await envoy_stat(client, "listener.0.0.0.0_15001.downstream_cx_total") >= 1
                assert await envoy_stat(backend, "listener.0.0.0.0_15006.downstream_cx_total") >= 1
                # A mesh name through the IPv6 resolver, answered by the client's agent on
                # [::1]:15053 with the VIP; the call then reaches the backend as before.
                status, body = await app_get(client, f"http://{HOST}/ok")
                assert status == 200 and isinstance(body, dict), body
                assert body["app"] == "backend" and "sa/client" in body["xfcc"], body
                # AuthorizationPolicy: another path is denied, for the same caller.
                status, text = await app_get(client, f"http://[{backend.ip6}]:9080/no", HOST)
                assert status == 403, text
                # A pod without a sidecar, over IPv6: captured inbound and refused (STRICT).
                status, why = await app_get(plain, f"http://[{backend.ip6}]:9080/ok", HOST)
                assert status == 0, why
            except BaseException:
                for a in agents:
                    print(f"--- {a.log_path.name}\n{a.log()[-3000:]}", file=sys.stderr)
                raise
            finally:
                for a in agents:
                    a.kill()
