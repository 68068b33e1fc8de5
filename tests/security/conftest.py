"""Fixtures of the attacker's suite: a real control plane to attack."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from control.app import ControlPlane
from tests.security.common import MESH, token
from tests.support.agentproc import AgentProcess
from tests.support.controlplane import eventually, running_control_plane
from tests.support.net import free_port, pod_ip


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    d = tmp_path / "cfg"
    d.mkdir()
    (d / "mesh.yaml").write_text(MESH)
    return d


@pytest.fixture
async def cp(cfg: Path, tmp_path: Path) -> AsyncIterator[ControlPlane]:
    """Plaintext, TLS and mTLS ports; CA root and token key in a state dir."""
    async with running_control_plane(cfg, mtls=True, state_dir=tmp_path / "state") as cp:
        yield cp


@dataclass
class RunningAgent:
    process: AgentProcess
    workdir: Path

    @property
    def xds_socket(self) -> Path:
        return self.workdir / "XDS"

    @property
    def sds_socket(self) -> Path:
        return self.workdir / "SDS"


@pytest.fixture
async def agent(cp: ControlPlane) -> AsyncIterator[RunningAgent]:
    """A real `pilotfish-agent --proxy-only` connected to `cp`, started with umask 000 (the
    worst case for the modes it creates). Its workdir is under a 0755 directory in /tmp, so
    another user can reach it: any refusal comes from the workdir's own modes and its
    sockets' and files', not from pytest's private tmp_path."""
    files = ("certs/key.pem", "grpc-bootstrap.json")
    async with _running_agent(cp, "--proxy-only", expect=files) as running:
        yield running


@pytest.fixture
async def sidecar(cp: ControlPlane) -> AsyncIterator[RunningAgent]:
    """The same agent with its Envoy and standard metrics: it also holds the metrics FIFO and
    the access-log socket, both of which take what Envoy reports as the pod's traffic."""
    async with _running_agent(cp, "--standard-metrics", "on", expect=("ALS", "METRICS")) as running:
        yield running


@contextlib.asynccontextmanager
async def _running_agent(
    cp: ControlPlane, *extra: str, expect: tuple[str, ...] = ()
) -> AsyncIterator[RunningAgent]:
    base = Path(tempfile.mkdtemp(prefix="pf-sec-", dir="/tmp"))
    base.chmod(0o755)
    workdir = base / "pod"
    ip = pod_ip()
    # AgentProcess creates the directory it is given (and writes the token there) from this
    # process, with this process's umask; the workdir the agent gets (the last --workdir
    # wins) is left for the agent itself to create.
    # The TLS port: only there is its certificate signed.
    assert cp.ca is not None
    (base / "root-cert.pem").write_text(cp.ca.root_pem)
    process = AgentProcess(
        f"127.0.0.1:{cp.secure_xds_port}",
        base,
        ip,
        "attacked-0",
        "app=attacked",
        *extra,
        "--service-account",
        "sleep",
        "--dns-port",
        "0",
        "--status-port",
        str(free_port(ip)),
        "--workdir",
        str(workdir),
        "--token-file",
        str(base / "token"),
        "--ca-root-cert",
        str(base / "root-cert.pem"),
        token=token(cp),
        wrap=("sh", "-c", 'umask 000 && exec "$@"', "agent"),
        log_path=base / "agent.log",
    )
    process.start()
    try:
        await eventually(
            lambda: all((workdir / p).exists() for p in ("XDS", "SDS", *expect)),
            timeout=20,
            what=f"agent sockets and files in {workdir}",
        )
        yield RunningAgent(process, workdir)
    finally:
        process.kill()
        shutil.rmtree(base, ignore_errors=True)
