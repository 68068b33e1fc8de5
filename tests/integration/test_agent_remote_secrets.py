"""The agent's gateway-certificate fetcher (agent/sds/remote.py) against a real control plane
over a real TLS upstream channel: one stream per held name, kept for the linger after the last
holder lets go and then closed (the secret is then no longer served), a refusal remembered
while the fetch lives so that a re-dialling Envoy gets it at once."""

from __future__ import annotations

import time
from pathlib import Path

import grpc

from agent.sds.remote import RemoteSecrets
from agent.sds.resources import SecretEntry
from agent.xdsproxy.upstream import UpstreamChannel, UpstreamTls
from control.app import ControlPlane
from control.ca.identity import Identity
from protos import typeurls
from tests.support.controlplane import agent_token, eventually, running_control_plane
from tests.support.mesh import root_file
from tests.support.secrets import secret_yaml
from tests.support.testca import TestCA

EDGE = Identity("edge", "gateway")


def _secret_streams(cp: ControlPlane) -> int:
    return sum(
        1 for c in cp.xds.connections.values() if typeurls.SECRET in c.state.subscribed_types
    )


async def test_fetch_lifetime_and_refusals(tmp_path: Path) -> None:
    ca = TestCA()
    cert = ca.server_cert(["gw"])
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(secret_yaml("gw-cert", cert, namespace="edge"))
    async with running_control_plane(cfg) as cp:
        token = tmp_path / "token"
        token.write_text(agent_token(cp, EDGE.namespace, EDGE.service_account))
        upstream = UpstreamChannel(
            [f"127.0.0.1:{cp.secure_xds_port}"], tls=UpstreamTls(root_file(cp, tmp_path), token)
        )
        updates: list[tuple[str, SecretEntry | None]] = []
        remote = RemoteSecrets(
            lambda: upstream.ads(delta=False),
            node_id="router~10.2.0.1~gw-1.edge~edge.svc.cluster.local",
            metadata={"SERVICE_ACCOUNT": EDGE.service_account},
            linger=0.5,
        )
        remote.bind(lambda name, entry: updates.append((name, entry)))
        async with upstream, remote:
            remote.acquire("kubernetes://gw-cert")
            remote.acquire("kubernetes://gw-cert")  # a second holder shares the stream
            await eventually(lambda: updates, what="secret fetched")
            name, entry = updates[0]
            assert name == "kubernetes://gw-cert" and entry is not None
            assert entry.secret().tls_certificate.certificate_chain.inline_bytes == cert.cert_pem
            assert _secret_streams(cp) == 1

            # The last holder lets go: the stream stays for the linger, then closes and the
            # secret is dropped.
            remote.release("kubernetes://gw-cert")
            remote.release("kubernetes://gw-cert")
            released = time.monotonic()
            assert _secret_streams(cp) == 1
            await eventually(lambda: _secret_streams(cp) == 0, what="stream closed")
            assert time.monotonic() - released >= 0.4
            assert updates[-1] == ("kubernetes://gw-cert", None)
            assert remote.names == []

            # Refused (another namespace's Secret): remembered while held and lingering.
            remote.acquire("kubernetes://other/x")
            await eventually(lambda: remote.refusal("kubernetes://other/x"), what="refusal")
            refusal = remote.refusal("kubernetes://other/x")
            assert refusal is not None and refusal[0] is grpc.StatusCode.PERMISSION_DENIED
            remote.release("kubernetes://other/x")
            remote.acquire("kubernetes://other/x")  # Envoy re-dials: the answer is there
            assert remote.refusal("kubernetes://other/x") == refusal
