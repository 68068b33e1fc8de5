"""Another local user against a running agent's workdir: the SDS socket hands out the pod's
private key and the XDS socket speaks to the control plane as the pod, so neither may be
reachable by another user; nor may the key file be read, or the workdir be written (a user
who can write it can replace the sockets), nor may the metrics FIFO or the access-log socket
be opened (whoever writes them invents the pod's traffic figures). The agent is started with
umask 000, so the modes are the agent's own doing. The attacker is a real process running as
`nobody` (the system python: the venv's lives under /root); the tests run as root."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess

import grpc
import pytest
from envoy.extensions.transport_sockets.tls.v3.secret_pb2 import Secret
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest, DiscoveryResponse

from protos import typeurls
from tests.security.conftest import RunningAgent

NOBODY = 65534
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")

# Stdlib only: each probe prints "ok" or the errno name it failed with.
PROBE = r"""
import errno, json, os, socket, sys
workdir = sys.argv[1]
def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def connect(name):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(os.path.join(workdir, name))
    finally:
        s.close()
def open_fifo(flags):
    os.close(os.open(os.path.join(workdir, "METRICS"), flags | os.O_NONBLOCK))
def plant():
    fd = os.open(os.path.join(workdir, "planted"), os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
    os.close(fd)
print(json.dumps({
    "uid": os.getuid(),
    "stat_workdir": attempt(lambda: os.stat(workdir)),
    "connect_sds": attempt(lambda: connect("SDS")),
    "connect_xds": attempt(lambda: connect("XDS")),
    "connect_als": attempt(lambda: connect("ALS")),
    "write_metrics": attempt(lambda: open_fifo(os.O_WRONLY)),
    "read_metrics": attempt(lambda: open_fifo(os.O_RDONLY)),
    "read_key": attempt(lambda: open(os.path.join(workdir, "certs", "key.pem"), "rb").read()),
    "list_certs": attempt(lambda: os.listdir(os.path.join(workdir, "certs"))),
    "plant_file": attempt(plant),
    "replace_xds": attempt(lambda: os.rename(os.path.join(workdir, "grpc-bootstrap.json"),
                                             os.path.join(workdir, "XDS"))),
    "unlink_sds": attempt(lambda: os.unlink(os.path.join(workdir, "SDS"))),
}))
"""


def _as_nobody(agent: RunningAgent) -> dict[str, object]:
    if SYSTEM_PYTHON is None or os.geteuid() != 0:
        pytest.skip("needs root and a system python3 that another user can run")
    out = subprocess.run(
        [SYSTEM_PYTHON, "-c", PROBE, str(agent.workdir)],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout)
    # The attacker is really someone else and really reaches the workdir: every refusal
    # below comes from the workdir's, the sockets' or the files' own modes.
    assert result["uid"] == NOBODY
    assert result["stat_workdir"] == "ok"
    return result


async def _fetch_default_secret(agent: RunningAgent) -> Secret:
    """What the socket's owner gets: the workload certificate and its private key."""
    async with grpc.aio.insecure_channel(f"unix:{agent.sds_socket}") as ch:
        fetch = ch.unary_unary(
            "/envoy.service.secret.v3.SecretDiscoveryService/FetchSecrets",
            request_serializer=DiscoveryRequest.SerializeToString,
            response_deserializer=DiscoveryResponse.FromString,
        )
        resp = await fetch(
            DiscoveryRequest(type_url=typeurls.SECRET, resource_names=["default"]), timeout=15
        )
    secret = Secret()
    resp.resources[0].Unpack(secret)
    return secret


async def test_sds_socket_refuses_another_user(agent: RunningAgent) -> None:
    # The socket serves private keys to its owner ...
    secret = await _fetch_default_secret(agent)
    assert b"PRIVATE KEY" in secret.tls_certificate.private_key.inline_bytes
    # ... and nobody else can even connect (connect(2) on a Unix socket needs write access).
    result = _as_nobody(agent)
    assert result["connect_sds"] == errno.errorcode[errno.EACCES]
    assert stat.S_IMODE(agent.sds_socket.stat().st_mode) == 0o600


async def test_xds_socket_refuses_another_user(agent: RunningAgent) -> None:
    result = _as_nobody(agent)
    assert result["connect_xds"] == errno.errorcode[errno.EACCES]
    # Owner and the pod's group only (nobody is not in it).
    assert stat.S_IMODE(agent.xds_socket.stat().st_mode) == 0o660
    assert agent.xds_socket.stat().st_gid != NOBODY


async def test_key_file_is_private(agent: RunningAgent) -> None:
    key = agent.workdir / "certs" / "key.pem"
    assert b"PRIVATE KEY" in key.read_bytes()
    result = _as_nobody(agent)
    assert result["read_key"] == errno.errorcode[errno.EACCES]
    assert result["list_certs"] == errno.errorcode[errno.EACCES]
    # Both layers: the certs/ directory (0750) and the key itself, through ..data (0600).
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600


async def test_workdir_cannot_be_written_by_another_user(agent: RunningAgent) -> None:
    """Under umask 000 a plain mkdir makes the workdir 0777: anyone could then put their own
    socket in place of XDS or SDS, and Envoy would take its config and secrets from it."""
    result = _as_nobody(agent)
    assert not stat.S_IMODE(agent.workdir.stat().st_mode) & 0o002
    assert result["plant_file"] == errno.errorcode[errno.EACCES]
    assert result["replace_xds"] == errno.errorcode[errno.EACCES]
    assert result["unlink_sds"] == errno.errorcode[errno.EACCES]
    assert agent.sds_socket.exists() and agent.xds_socket.exists()


async def test_metrics_inputs_refuse_another_user(sidecar: RunningAgent) -> None:
    """What arrives on the metrics FIFO and the access-log socket becomes the pod's
    `istio_*` series: another user who could write either could invent traffic (or read the
    FIFO and steal what Envoy reports of it)."""
    fifo, als = sidecar.workdir / "METRICS", sidecar.workdir / "ALS"
    assert stat.S_ISFIFO(fifo.stat().st_mode) and stat.S_ISSOCK(als.stat().st_mode)
    result = _as_nobody(sidecar)
    assert result["write_metrics"] == errno.errorcode[errno.EACCES]
    assert result["read_metrics"] == errno.errorcode[errno.EACCES]
    assert result["connect_als"] == errno.errorcode[errno.EACCES]
    assert stat.S_IMODE(fifo.stat().st_mode) == 0o600
    assert stat.S_IMODE(als.stat().st_mode) == 0o600
    # The owner, by contrast, gets through (the refusals above are the modes, not a FIFO
    # that is gone or a socket nobody serves).
    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
