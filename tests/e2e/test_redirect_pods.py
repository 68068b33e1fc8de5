"""Interception mode REDIRECT with pods as network namespaces (tests/support/netns.py): each
pod runs `pilotfish-agent iptables --capture-dns` (its init step), then the agent and Envoy;
apps inside know nothing of the mesh (no proxy settings, the system resolver).

The control plane, an upstream DNS server and a server outside the mesh listen in the root
namespace at the pod network's gateway address."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import textwrap
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import aiohttp
import pytest

from control.app import ControlPlane
from tests.support.agentproc import AgentProcess
from tests.support.apps import EchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.dns import UpstreamDns
from tests.support.iptables import nat_lines
from tests.support.mesh import mesh_agent, workload_group_yaml
from tests.support.netns import Pod, PodNetwork, pod_network

pytestmark = pytest.mark.envoy

VIP = "10.96.0.50"
TCP_VIP = "10.96.0.51"
MESH = textwrap.dedent(
    f"""\
    apiVersion: v1
    kind: Service
    metadata: {{name: backend, namespace: default}}
    spec:
      clusterIP: {VIP}
      selector: {{app: backend}}
      ports: [{{name: http, port: 9080, targetPort: 9080}}]
    ---
    apiVersion: v1
    kind: Service
    metadata: {{name: tunnel, namespace: default}}
    spec:
      clusterIP: {TCP_VIP}
      selector: {{app: nobody}}
      ports: [{{name: tcp, port: 7000}}]
    ---
    apiVersion: security.istio.io/v1
    kind: PeerAuthentication
    metadata: {{name: default, namespace: istio-system}}
    spec:
      mtls: {{mode: STRICT}}
    ---
    """
) + workload_group_yaml("backend")
REGISTRY_ONLY = textwrap.dedent(
    """\
    apiVersion: networking.istio.io/v1
    kind: Sidecar
    metadata: {name: client, namespace: default}
    spec:
      workloadSelector: {labels: {app: client}}
      outboundTrafficPolicy: {mode: REGISTRY_ONLY}
    """
)
# Per-route filters in mode REDIRECT's virtual outbound chains: a fault abort and a direct
# response on paths of their own, the rest of the backend's traffic untouched.
ROUTE_FILTERS = textwrap.dedent(
    """\
    apiVersion: networking.istio.io/v1
    kind: VirtualService
    metadata: {name: backend, namespace: default}
    spec:
      hosts: [backend]
      http:
      - match: [{uri: {prefix: /teapot}}]
        fault: {abort: {httpStatus: 418, percentage: {value: 100}}}
        route: [{destination: {host: backend}}]
      - match: [{uri: {prefix: /down}}]
        directResponse: {status: 503, body: {string: maintenance}}
      - route: [{destination: {host: backend}}]
    """
)
# A `tcp` route in mode REDIRECT's virtual outbound TCP chains (matched by the service's VIP):
# the tunnel service has no endpoints of its own; its route sends connections to the backend.
TCP_ROUTE = textwrap.dedent(
    """\
    apiVersion: networking.istio.io/v1
    kind: VirtualService
    metadata: {name: tunnel, namespace: default}
    spec:
      hosts: [tunnel]
      tcp: [{route: [{destination: {host: backend, port: {number: 9080}}}]}]
    """
)
OUTSIDE_PORT = 8088


async def app_get(pod: Pod, url: str) -> tuple[int, dict[str, str] | str]:
    """The pod's app calls `url`: (status, JSON body) or (0, why it failed). In a thread: the
    servers in the root namespace run on this event loop."""
    out = await asyncio.to_thread(
        pod.run, sys.executable, "-m", "tests.support.podapp", "get", url, timeout=30
    )
    text = out.stdout.strip()
    status, _, body = text.partition(" ")
    if status == "ERROR" or not status.isdigit():
        return 0, text + out.stderr
    try:
        return int(status), json.loads(body)
    except ValueError:
        return int(status), body


async def envoy_stat(pod: Pod, name: str) -> int:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s,
        s.get(f"http://{pod.ip}:15000/stats?filter=^{name}$") as r,
    ):
        text = await r.text()
    for line in text.splitlines():
        key, _, value = line.partition(": ")
        if key == name:
            return int(value)
    return 0


async def ready(pod: Pod) -> bool:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s,
            s.get(f"http://{pod.ip}:15020/healthz/ready") as r,
        ):
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


@pytest.fixture
async def workdirs() -> AsyncIterator[Path]:
    # Envoy runs as UID 1337: its workdir must be reachable by that user, which pytest's
    # private tmp_path (0700) is not.
    base = Path(tempfile.mkdtemp(prefix="pf-redirect-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def start_sidecar(
    pod: Pod,
    cp: ControlPlane,
    host: str,
    workdir: Path,
    log_dir: Path,
    app: str,
    group: str,
    *,
    capture: tuple[str, ...] = ("--capture-dns",),
    env: dict[str, str] | None = None,
) -> AgentProcess:
    """The pod's agent, on the control plane's TLS port at `host` with a token of service
    account `app`; `group`: the WorkloadGroup it registers in ("" = a client only);
    `capture`: the flags of its `pilotfish-agent iptables` step; `env`: the agent's extra
    environment."""
    pod.run(sys.executable, "-m", "agent", "iptables", *capture, check=True)
    agent = mesh_agent(
        cp,
        workdir,
        pod.ip,
        pod.name,
        f"app={app}",
        "--interception-mode",
        "REDIRECT",
        group=group,
        service_account=app,
        host=host,
        wrap=pod.command(),
        env=env,
        log_path=log_dir / f"{pod.name}-agent.log",
    )
    agent.start()
    return agent


async def test_redirect_pods_mtls_policy_and_no_loops(tmp_path: Path, workdirs: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    agents: list[AgentProcess] = []
    with pod_network() as net:
        client, backend, plain = net.add_pod("client"), net.add_pod("backend"), net.add_pod("plain")
        backend.spawn(
            backend.python("-m", "tests.support.podapp", "serve", "backend", "9080"),
            tmp_path / "backend-app.log",
        )
        # Outside the mesh, in the root namespace: a server on an unknown port, one on the
        # mesh's HTTP port (reached through the routes' fallback), and the pods' resolver.
        outside = EchoApp("outside", net.gateway, OUTSIDE_PORT)
        outside_http = EchoApp("outside-9080", net.gateway, 9080)
        dns = UpstreamDns(net.gateway, {"outside.test": net.gateway}, port=53)
        async with running_control_plane(cfg, host=net.gateway) as cp:
            await outside.start()
            await outside_http.start()
            await dns.start()
            try:
                for pod, app, group in ((client, "client", ""), (backend, "backend", "backend")):
                    agents.append(
                        start_sidecar(pod, cp, net.gateway, workdirs, tmp_path, app, group)
                    )
                for pod, agent in zip((client, backend), agents, strict=True):
                    await eventually(
                        lambda pod=pod, agent=agent: _alive(agent) and ready(pod),
                        timeout=60,
                        what=f"{pod.name} ready",
                    )
                await _scenario(net, client, backend, plain, cfg, dns)
            except BaseException:
                for a in agents:
                    print(f"--- {a.log_path.name}\n{a.log()[-3000:]}", file=sys.stderr)
                raise
            finally:
                for a in agents:
                    a.kill()
                await dns.close()
                await outside.close()
                await outside_http.close()


async def _scenario(
    net: PodNetwork, client: Pod, backend: Pod, plain: Pod, cfg: Path, dns: UpstreamDns
) -> None:
    mesh_url = "http://backend.default.svc.cluster.local:9080/"
    # The name resolves (through the captured DNS, to the VIP) and the call goes over mTLS:
    # the backend's sidecar tells the app who called.
    status, body = await eventually(
        lambda: _ok_async(app_get(client, mesh_url)), timeout=30, what="client -> backend"
    )
    assert isinstance(body, dict) and body["app"] == "backend"
    assert "URI=spiffe://cluster.local/ns/default/sa/client" in body["xfcc"], body
    assert body["host"] == "backend.default.svc.cluster.local:9080"

    # Envoy's own connections are not captured: each app connection is accepted by
    # virtualOutbound exactly once (a loop would multiply them or fail the call); and the
    # agent's (xDS, certificates over the control-plane connection) never passed through
    # Envoy, or the passthrough cluster would have counted them.
    before = await envoy_stat(client, "listener.0.0.0.0_15001.downstream_cx_total")
    for _ in range(3):
        assert _ok(await app_get(client, mesh_url)) is not None
    after = await envoy_stat(client, "listener.0.0.0.0_15001.downstream_cx_total")
    assert after - before == 3
    assert await envoy_stat(client, "cluster.PassthroughCluster.upstream_cx_total") == 0

    # A pod without a sidecar is refused under STRICT (it cannot do the mTLS handshake) ...
    status, why = await app_get(plain, f"http://{backend.ip}:9080/")
    assert status == 0, why
    # ... though the network between them works: the backend agent's status port, excluded
    # from capture, answers it.
    assert (await app_get(plain, f"http://{backend.ip}:15020/healthz/ready"))[0] == 200

    # A name outside the mesh: the agent forwards it to the resolver on port 53, which the
    # capture rules would send back to the agent were its own traffic not excluded. Then
    # ALLOW_ANY (the default) passes the unknown destination through.
    queries = dns.queries
    outside_url = f"http://outside.test:{OUTSIDE_PORT}/"
    status, body = await app_get(client, outside_url)
    assert status == 200 and isinstance(body, dict) and body["app"] == "outside", body
    assert dns.queries > queries
    assert await envoy_stat(client, "cluster.PassthroughCluster.upstream_cx_total") == 1
    # HTTP to an unknown host on a mesh HTTP port goes through the routes' allow_any.
    status, body = await app_get(client, f"http://{net.gateway}:9080/")
    assert status == 200 and isinstance(body, dict) and body["app"] == "outside-9080", body

    # REGISTRY_ONLY (a Sidecar overriding the mesh-wide default): unknown destinations are
    # refused, by TCP (BlackHoleCluster) and by HTTP (502); the mesh still works.
    (cfg / "sidecar.yaml").write_text(REGISTRY_ONLY)
    await eventually(
        lambda: _status_is(app_get(client, f"http://{net.gateway}:9080/"), 502),
        timeout=30,
        what="REGISTRY_ONLY applied",
    )
    status, why = await app_get(client, outside_url)
    assert status == 0, why
    assert _ok(await app_get(client, mesh_url)) is not None

    # A VirtualService's fault and direct response apply in the virtual outbound listener's
    # HTTP chains (the fault filter is in them, as in mode NONE's listeners).
    (cfg / "routes.yaml").write_text(ROUTE_FILTERS)
    await eventually(
        lambda: _status_is(app_get(client, mesh_url + "teapot"), 418),
        timeout=30,
        what="fault abort in mode REDIRECT",
    )
    assert await app_get(client, mesh_url + "down") == (503, "maintenance")
    assert _ok(await app_get(client, mesh_url)) is not None

    # A VirtualService's tcp route applies in the virtual outbound listener's TCP chains:
    # before it, the tunnel's VIP leads nowhere; with it, to the backend (over mTLS).
    tunnel_url = f"http://{TCP_VIP}:7000/"
    assert (await app_get(client, tunnel_url))[0] == 0
    (cfg / "tunnel.yaml").write_text(TCP_ROUTE)
    status, body = await eventually(
        lambda: _ok_async(app_get(client, tunnel_url)), timeout=30, what="tcp route in REDIRECT"
    )
    assert isinstance(body, dict) and body["app"] == "backend", body


def _alive(agent: AgentProcess) -> bool:
    assert agent.proc is not None
    if agent.proc.poll() is not None:
        raise AssertionError(f"agent exited with {agent.proc.returncode}")
    return True


async def _ok_async(call: Awaitable[tuple[int, object]]) -> tuple[int, object] | None:
    return _ok(await call)


async def _status_is(call: Awaitable[tuple[int, object]], status: int) -> bool:
    return (await call)[0] == status


def _ok(result: tuple[int, object]) -> tuple[int, object] | None:
    return result if result[0] == 200 else None


async def test_iptables_dry_run_matches_installed_and_cleanup_restores() -> None:
    with pod_network() as net:
        pod = net.add_pod("rules")
        flags = (
            "--capture-dns",
            "--exclude-outbound-ports",
            "22",
            "--exclude-outbound-ip-ranges",
            "10.0.0.0/8",
            "--include-inbound-ports",
            "9080,8080",
        )
        agent = (sys.executable, "-m", "agent", "iptables", *flags)
        save = ("iptables-save", "-t", "nat")
        before = nat_lines(pod.run(*save, check=True).stdout)
        dry = pod.run(*agent, "--dry-run", check=True).stdout.splitlines()
        assert dry[0] == "*nat" and dry[-1] == "COMMIT"
        # --dry-run changed nothing.
        assert nat_lines(pod.run(*save, check=True).stdout) == before
        assert pod.run(*agent, check=True).returncode == 0
        installed = nat_lines(pod.run(*save, check=True).stdout)
        added = [line for line in installed if line not in before]
        # What was printed is exactly what was installed, rule order within each chain too.
        assert _by_chain(added) == _by_chain(dry[1:-1])
        assert any("--dport 53 -j REDIRECT --to-ports 15053" in line for line in added)
        # Applying again replaces, never doubles.
        assert pod.run(*agent, check=True).returncode == 0
        assert nat_lines(pod.run(*save, check=True).stdout) == installed
        # Cleanup removes exactly what was added; a second cleanup finds nothing.
        done = pod.run(*agent[:4], "--cleanup", check=True)
        assert "removed" in done.stdout
        assert nat_lines(pod.run(*save, check=True).stdout) == before
        assert "no capture rules" in pod.run(*agent[:4], "--cleanup", check=True).stdout


def _by_chain(lines: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in lines:
        chain = line[1:].split()[0] if line.startswith(":") else line.split()[1]
        out.setdefault(chain, []).append(line)
    return out


async def test_iptables_without_net_admin_is_a_clear_error() -> None:
    # setpriv drops every capability: what an init container without NET_ADMIN sees.
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    proc = await asyncio.create_subprocess_exec(
        "setpriv",
        "--inh-caps=-all",
        "--bounding-set=-all",
        sys.executable,
        "-m",
        "agent",
        "iptables",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    out, err = await proc.communicate()
    assert proc.returncode == 1
    assert err.decode().strip() == (
        "pilotfish-agent iptables: changing iptables needs root or CAP_NET_ADMIN (run as an "
        "init container with NET_ADMIN, or use --dry-run to only print the rules)"
    )
    assert b"Traceback" not in err
