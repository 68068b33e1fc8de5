"""Issue 4's acceptance with every part real: a control plane (CA, tokens, TLS port), one
`pilotfish-agent` subprocess per pod running its own Envoy, workload certificates over SDS,
and apps on the pods' loopback IPs. The agents talk to the control plane on its TLS port.

- the backend app sees `x-forwarded-client-cert` naming the caller's SPIFFE ID; a plaintext
  client is refused under STRICT and accepted once PeerAuthentication says PERMISSIVE (YAML
  changed at runtime);
- AuthorizationPolicy: DENY on a path, ALLOW by principal (a second client pod with another
  service account is refused);
- each agent holds exactly one TCP connection to the control plane, carrying Envoy's xDS,
  its own stream and certificate signing;
- rotation: 20-second certificates, a minute of HTTP load between two pods, zero failures
  while the backend Envoy's `/certs` shows new serials.

The wrong-root refusal is in tests/e2e/test_agent_tls.py; tokens, CSR identities and key file
modes are in tests/integration/test_ca_service.py and the SDS tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from control.app import ControlPlane
from tests.support.agentproc import AgentProcess
from tests.support.apps import EchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.mesh import backend_yaml, mesh_agent
from tests.support.net import pod_ip

pytestmark = pytest.mark.envoy

BACKEND_HOST = "backend.default.svc.cluster.local"

MESH = backend_yaml()


def peer_authentication(mode: str) -> str:
    """The mesh-wide policy (root namespace, no selector)."""
    return textwrap.dedent(
        f"""\
        apiVersion: security.istio.io/v1
        kind: PeerAuthentication
        metadata: {{name: default, namespace: istio-system}}
        spec:
          mtls: {{mode: {mode}}}
        """
    )


DENY_ADMIN = textwrap.dedent(
    """\
    apiVersion: security.istio.io/v1
    kind: AuthorizationPolicy
    metadata: {name: deny-admin, namespace: default}
    spec:
      selector: {matchLabels: {app: backend}}
      action: DENY
      rules:
      - to: [{operation: {paths: ["/admin*"]}}]
    """
)

ALLOW_CLIENT = textwrap.dedent(
    """\
    apiVersion: security.istio.io/v1
    kind: AuthorizationPolicy
    metadata: {name: allow-client, namespace: default}
    spec:
      selector: {matchLabels: {app: backend}}
      action: ALLOW
      rules:
      - from: [{source: {principals: ["cluster.local/ns/default/sa/client"]}}]
    """
)


def spiffe(service_account: str) -> str:
    return f"spiffe://cluster.local/ns/default/sa/{service_account}"


# --- pods ------------------------------------------------------------------------------------


@dataclass
class Pod:
    name: str
    ip: str
    agent: AgentProcess

    @property
    def admin(self) -> str:
        return f"http://{self.ip}:15000"


@dataclass
class Mesh:
    cp: ControlPlane
    cfg: Path
    app: EchoApp
    backend: Pod
    clients: list[Pod]


@asynccontextmanager
async def running_mesh(
    tmp_path: Path, client_accounts: list[str], *agent_args: str, **cp_opts: float
) -> AsyncIterator[Mesh]:
    """A control plane, a backend pod (agent + Envoy + app, service account `backend`) and
    one client pod per service account (agent + Envoy, no app: the test is the app). Every
    agent is on the TLS port with its own token and the root to verify the control plane by;
    returns once all of them are ready."""
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    (cfg / "peerauthentication.yaml").write_text(peer_authentication("STRICT"))
    backend_ip = pod_ip()
    app = EchoApp("backend", backend_ip, 8080)
    await app.start()
    pods: list[Pod] = []
    try:
        async with running_control_plane(cfg, **cp_opts) as cp:

            def pod(name: str, ip: str, account: str, group: str = "") -> Pod:
                agent = mesh_agent(
                    cp,
                    tmp_path,
                    ip,
                    name,
                    f"app={account}",
                    *agent_args,
                    group=group,
                    service_account=account,
                )
                pods.append(Pod(name, ip, agent))
                agent.start()
                return pods[-1]

            # The backend registers through its WorkloadGroup (service account backend).
            backend = pod("backend", backend_ip, "backend", group="backend")
            clients = [pod(f"{account}-0", pod_ip(), account) for account in client_accounts]
            for p in pods:
                await eventually(
                    lambda p=p: _ready(p),
                    timeout=40,
                    what=f"{p.name} agent ready",  # type: ignore[misc]
                )
            yield Mesh(cp, cfg, app, backend, clients)
    finally:
        for p in pods:
            p.agent.kill()
        await app.close()


async def _ready(pod: Pod) -> bool:
    if pod.agent.proc is not None and pod.agent.proc.poll() is not None:
        raise AssertionError(f"{pod.name} agent exited:\n{pod.agent.log()[-3000:]}")
    status, _ = await get(f"http://{pod.ip}:15020/healthz/ready")
    return status == 200


async def get(
    url: str, host: str | None = None, session: aiohttp.ClientSession | None = None
) -> tuple[int, str]:
    """(status, body); status 0 when no HTTP response came back at all."""
    headers = {"Host": host} if host else {}
    try:
        if session is not None:
            async with session.get(url, headers=headers) as r:
                return r.status, await r.text()
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s,
            s.get(url, headers=headers) as r,
        ):
            return r.status, await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return 0, ""


async def via(client: Pod, path: str) -> tuple[int, dict[str, str | None]]:
    """A request from the client pod's app: to its own Envoy's outbound listener, by Host."""
    status, body = await get(f"http://{client.ip}:9080{path}", BACKEND_HOST)
    return status, (json.loads(body) if status == 200 else {})


async def plaintext(ip: str, port: int, path: str = "/hello") -> bytes:
    """A raw HTTP/1.1 request to `ip:port`; returns whatever came back. The TCP connect must
    succeed: a refusal by a listener that is not there proves nothing about STRICT."""
    reader, writer = await asyncio.open_connection(ip, port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 5)
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


def write_config(mesh: Mesh, name: str, text: str | None) -> None:
    """Change the watched config (None: remove the file); the control plane hot-reloads it."""
    path = mesh.cfg / name
    if text is None:
        path.unlink()
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# --- (d) one connection ----------------------------------------------------------------------


def tcp_connections_to(pid: int, port: int) -> int:
    """Established TCP connections to `port` whose socket the process `pid` holds: its socket
    inodes from /proc/<pid>/fd matched against /proc/net/tcp{,6}."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            remote, state, inode = fields[2], fields[3], fields[9]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port and inode in inodes:
                count += 1
    return count


async def test_mtls_between_agent_pods_peer_authentication_and_authorization(
    tmp_path: Path,
) -> None:
    async with running_mesh(tmp_path, ["client", "other"]) as mesh:
        client, other = mesh.clients
        backend_ip = mesh.backend.ip

        # (d) Each agent: one TCP connection to the control plane's TLS port, carrying Envoy's
        # xDS stream, the agent's own stream and the CreateCertificate calls; nothing on the
        # plaintext port.
        cp = mesh.cp
        for p in (mesh.backend, client, other):
            assert p.agent.proc is not None
            assert tcp_connections_to(p.agent.proc.pid, cp.secure_xds_port) == 1, p.name
            assert tcp_connections_to(p.agent.proc.pid, cp.xds_port) == 0, p.name
            status, metrics = await get(f"http://{p.ip}:15020/stats/prometheus")
            assert "pilotfish_agent_xds_downstream_streams 1.0" in metrics, p.name

        # (a) mTLS: the backend app learns the caller's SPIFFE ID from its sidecar.
        status, body = await eventually(
            lambda: _ok(via(client, "/hello")), timeout=20, what="client -> backend"
        )
        xfcc = body["xfcc"] or ""
        assert f"URI={spiffe('client')}" in xfcc and f"By={spiffe('backend')}" in xfcc, xfcc
        status, body = await via(other, "/hello")
        assert status == 200 and f"URI={spiffe('other')}" in (body["xfcc"] or "")

        # STRICT (mesh-wide): plain HTTP straight to the backend's inbound port connects to
        # Envoy's listener and is dropped without a response; the app never sees it.
        seen = mesh.app.requests
        assert await plaintext(backend_ip, 9080) == b""
        assert mesh.app.requests == seen

        # PERMISSIVE, changed at runtime: the same plaintext request is served (no identity),
        # and mesh clients keep using mTLS.
        write_config(mesh, "peerauthentication.yaml", peer_authentication("PERMISSIVE"))

        async def served() -> bytes | None:
            answer = await plaintext(backend_ip, 9080)
            return answer if answer.startswith(b"HTTP/1.1 200") else None

        answer = await eventually(served, timeout=20, what="plaintext accepted (PERMISSIVE)")
        body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert body["app"] == "backend" and body["xfcc"] is None
        status, body = await via(client, "/hello")
        assert status == 200 and f"URI={spiffe('client')}" in (body["xfcc"] or "")

        # And back to STRICT.
        write_config(mesh, "peerauthentication.yaml", peer_authentication("STRICT"))
        await eventually(
            lambda: _is(plaintext(backend_ip, 9080), b""), timeout=20, what="STRICT again"
        )

        # (c) DENY on a path: 403 for it, 200 for others. After each policy change every
        # answer is checked once it has settled: a client's pooled connections keep the filter
        # chain they were accepted on until the backend Envoy drains them (Envoy's listener
        # update semantics), so for a moment old and new chains both answer.
        write_config(mesh, "deny.yaml", DENY_ADMIN)
        await settled(
            [
                (client, "/admin/users", 403),
                (client, "/hello", 200),
                (other, "/admin", 403),
                (other, "/hello", 200),
            ],
            what="DENY applied",
        )

        # ALLOW by principal: only the client's identity gets through; DENY still wins.
        write_config(mesh, "allow.yaml", ALLOW_CLIENT)
        await settled(
            [
                (other, "/hello", 403),
                (other, "/data", 403),
                (client, "/hello", 200),
                (client, "/admin/users", 403),
            ],
            what="ALLOW applied",
        )

        # Policies removed: everyone is back in.
        write_config(mesh, "allow.yaml", None)
        write_config(mesh, "deny.yaml", None)
        await eventually(
            lambda: _status(via(other, "/admin"), 200), timeout=20, what="policies removed"
        )


# --- (b) rotation under load -----------------------------------------------------------------

CERT_TTL = 20
LOAD_SECONDS = 60.0
LOAD_RATE = 20  # requests per second


async def workload_serials(session: aiohttp.ClientSession, admin: str, spiffe_id: str) -> set[str]:
    """Serial numbers of the workload certificates (leaf for `spiffe_id`) Envoy holds now."""
    async with session.get(admin + "/certs") as r:
        data = await r.json(content_type=None)
    serials = set()
    for entry in data.get("certificates", []):
        for cert in entry.get("cert_chain", []):
            uris = [s.get("uri") for s in cert.get("subject_alt_names", [])]
            if spiffe_id in uris:
                serials.add(cert["serial_number"])
    return serials


async def test_rotation_under_load_drops_nothing(tmp_path: Path) -> None:
    async with running_mesh(
        tmp_path, ["client"], "--workload-cert-ttl", str(CERT_TTL), max_workload_cert_ttl=3600
    ) as mesh:
        (client,) = mesh.clients
        url = f"http://{client.ip}:9080/load"
        await eventually(lambda: _status(via(client, "/hello"), 200), timeout=20, what="traffic")

        results: dict[int, int] = {}
        failures: list[str] = []
        seen_serials: list[str] = []  # in the order they first appeared at the backend
        handshakes_before = await _handshakes(mesh.backend)

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:

            async def one() -> None:
                status, body = await get(url, BACKEND_HOST, session)
                results[status] = results.get(status, 0) + 1
                if status != 200:
                    failures.append(f"{time.monotonic() - start:.1f}s: {status} {body[:200]}")
                elif spiffe("client") not in (json.loads(body)["xfcc"] or ""):
                    failures.append(f"no client identity in {body[:200]}")

            async def load() -> None:
                # A steady rate, not a closed loop: a stall shows up as failures or a backlog
                # of requests in flight, not as a quietly slower test.
                tasks = []
                n = int(LOAD_SECONDS * LOAD_RATE)
                for i in range(n):
                    delay = start + i / LOAD_RATE - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    tasks.append(asyncio.create_task(one()))
                await asyncio.gather(*tasks)

            async def watch_certs() -> None:
                while time.monotonic() - start < LOAD_SECONDS:
                    for serial in await workload_serials(
                        session, mesh.backend.admin, spiffe("backend")
                    ):
                        if serial not in seen_serials:
                            seen_serials.append(serial)
                    await asyncio.sleep(0.5)

            start = time.monotonic()
            await asyncio.gather(load(), watch_certs())

        handshakes = await _handshakes(mesh.backend) - handshakes_before
        total = sum(results.values())
        print(
            f"\nrotation: {CERT_TTL}s certificates, {total} requests in {LOAD_SECONDS:.0f}s "
            f"at {LOAD_RATE}/s: {results.get(200, 0)} ok, {len(failures)} failed; "
            f"backend /certs serials seen in order: {seen_serials}; "
            f"TLS handshakes at the backend during the load: {handshakes}"
        )
        assert not failures, failures[:10]
        assert results == {200: int(LOAD_SECONDS * LOAD_RATE)}
        # The first serial is the one held when the load started; two changes need three.
        assert len(seen_serials) >= 3, seen_serials


async def _handshakes(pod: Pod) -> int:
    """TLS handshakes completed on the backend Envoy's listeners (all of them, summed)."""
    status, text = await get(pod.admin + "/stats?filter=^listener.*ssl.handshake$")
    assert status == 200
    return sum(int(line.rsplit(": ", 1)[1]) for line in text.splitlines() if ": " in line)


# --- helpers ---------------------------------------------------------------------------------


async def _ok(call: object) -> tuple[int, dict[str, str | None]] | None:
    status, body = await call  # type: ignore[misc]
    return (status, body) if status == 200 else None


async def settled(expected: list[tuple[Pod, str, int]], what: str, runs: int = 5) -> None:
    """Wait until `runs` rounds in a row give every (pod, path) its expected status."""

    async def all_as_expected() -> bool:
        for _ in range(runs):
            for pod, path, want in expected:
                if (await via(pod, path))[0] != want:
                    return False
        return True

    await eventually(all_as_expected, timeout=30, what=what)


async def _status(call: object, want: int) -> bool:
    status, _ = await call  # type: ignore[misc]
    return bool(status == want)


async def _is(call: object, want: bytes) -> bool:
    return bool(await call == want)  # type: ignore[misc]
