"""`pilotfish-ctl proxy-status` finding the control-plane replicas through the Kubernetes API
(the in-test API server, tests/support/kubeapi.py, lists the control-plane pods by label) and
asking each over its TLS xDS port with a bearer token: two real replicas sharing a root, a
proxy connected to each, one row per proxy with its replica."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest

from control.app import ControlPlane, ControlPlaneOptions
from control.ca.identity import Identity
from control.ctl.discover import replica_addresses
from control.ctl.status import TokenError, token_identity
from control.xds.server import XdsOptions
from protos import typeurls
from tests.support.adsclient import AdsStream, node_id
from tests.support.controlplane import bounded_teardown, eventually
from tests.support.kubeapi import FakeKubeApi, pod
from tests.support.net import free_port, pod_ip


async def ctl(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "control.ctl",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def control_plane_pod(name: str, ip: str, labels: dict[str, str]) -> dict[str, Any]:
    return pod(name, ip, labels, namespace="istio-system", service_account="istiod")


async def test_proxy_status_finds_replicas_through_the_kubernetes_api(tmp_path: Path) -> None:
    ip_a, ip_b, proxy_a, proxy_b = pod_ip(), pod_ip(), pod_ip(), pod_ip()
    port = free_port(ip_a)
    state = tmp_path / "state"  # one root and token key for both replicas
    replicas = [
        ControlPlane(
            ControlPlaneOptions(
                xds_address="127.0.0.1:0",
                secure_xds_address=f"{ip}:{port}",
                http_address="127.0.0.1:0",
                state_dir=str(state),
                id=name,
                xds=XdsOptions(control_plane_id=name),
            )
        )
        for name, ip in (("istiod-a", ip_a), ("istiod-b", ip_b))
    ]
    streams: list[AdsStream] = []
    channels: list[grpc.aio.Channel] = []
    async with FakeKubeApi() as api:
        api.put(control_plane_pod("istiod-a", ip_a, {"app": "istiod"}))
        api.put(control_plane_pod("istiod-b", ip_b, {"app": "istiod"}))
        api.put(control_plane_pod("other", pod_ip(), {"app": "other"}))
        pending = control_plane_pod("istiod-c", "", {"app": "istiod"})
        pending["status"] = {"phase": "Pending"}
        api.put(pending)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig())
        try:
            for cp in replicas:
                await cp.start()
            # A proxy on each replica (plaintext port: a raw ADS stream asking for CDS).
            for cp, ip in zip(replicas, (proxy_a, proxy_b), strict=True):
                channel = grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}")
                channels.append(channel)
                stream = AdsStream(channel)
                streams.append(stream)
                req = DiscoveryRequest(type_url=typeurls.CLUSTER)
                req.node.id = node_id(ip, pod=f"app-{ip.rsplit('.', 1)[1]}")
                await stream.send(req)
                resp = await stream.recv()
                ack = DiscoveryRequest(
                    type_url=typeurls.CLUSTER,
                    version_info=resp.version_info,
                    response_nonce=resp.nonce,
                )
                ack.node.CopyFrom(req.node)
                await stream.send(ack)
            assert replicas[0].ca is not None and replicas[0].tokens is not None
            root = tmp_path / "root-cert.pem"
            root.write_text(replicas[0].ca.root_pem)
            token = tmp_path / "token"
            token.write_text(
                replicas[0].tokens.issue(Identity("istio-system", "istiod"), 600, time.time())
            )
            args = [
                "proxy-status",
                "--kubeconfig",
                str(kubeconfig),
                "--xds-port",
                str(port),
                "--ca-root-cert",
                str(root),
                "--token-file",
                str(token),
            ]

            async def both_rows() -> list[dict[str, Any]] | None:
                code, out, err = await ctl(*args, "-o", "json")
                assert code == 0, err
                rows: list[dict[str, Any]] = json.loads(out)
                synced = all(r["types"]["CDS"]["state"] == "SYNCED" for r in rows)
                return rows if len(rows) == 2 and synced else None

            rows = await eventually(both_rows, timeout=30, what="a SYNCED row per proxy")
            assert {(r["ip"], r["replica"]) for r in rows} == {
                (proxy_a, "istiod-a"),
                (proxy_b, "istiod-b"),
            }
            assert "LIST pods" in api.requests

            # Without a token the TLS port refuses: the replicas are named, exit 1.
            code, out, err = await ctl(*args[:-2])
            assert code == 1 and f"{ip_a}:{port}" in err and f"{ip_b}:{port}" in err, err
            assert "UNAUTHENTICATED" in err and "Traceback" not in err
            # A selector that finds nothing: one clear line.
            code, _, err = await ctl(*args, "--control-plane-selector", "app=nothing")
            assert code == 1 and "no running control-plane pods" in err
            # An API server that is not there: one clear line.
            bad = tmp_path / "bad-kubeconfig"
            bad.write_text(api.kubeconfig().replace(str(api.port), str(free_port())))
            code, _, err = await ctl("proxy-status", "--kubeconfig", str(bad))
            assert code == 1 and "cannot list control-plane pods" in err
            assert "Traceback" not in err
        finally:
            for s in streams:
                await s.close()
            for c in channels:
                await c.close()
            for cp in replicas:
                await bounded_teardown(cp.close(0.5), "control plane close")


def test_replica_addresses_and_token_identity() -> None:
    running = pod("istiod-b", "10.0.0.2", {})
    deleting = pod("istiod-x", "10.0.0.9", {})
    deleting["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    v6 = pod("istiod-a", "fd00::1", {})
    assert replica_addresses([running, deleting, v6], 15012) == [
        "[fd00::1]:15012",
        "10.0.0.2:15012",
    ]
    import base64

    claims = base64.urlsafe_b64encode(b'{"sub":"system:serviceaccount:ops:viewer"}').decode()
    assert token_identity(f"e30.{claims.rstrip('=')}.sig") == ("ops", "viewer")
    for bad in ("not-a-jwt", "e30.e30.sig"):
        try:
            token_identity(bad)
        except TokenError:
            continue
        raise AssertionError(f"{bad} accepted")
