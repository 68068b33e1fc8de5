"""What a proxy-only agent gives proxyless gRPC apps for mTLS: the bootstrap's certificate
provider and server listener template, the node metadata that tells the control plane, and
the certificate files (atomic, key 0600, rewritten on every rotation) — with a real CA."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from agent.app import grpc_bootstrap
from agent.config import AgentConfig
from agent.sds.certcheck import workload_cert
from agent.sds.certfiles import (
    CertFileWriter,
    CertPaths,
    refresh_interval,
    write_cert_files,
)
from agent.sds.keys import generate_key_and_csr
from agent.sds.secrets import SdsConfig, SecretManager
from agent.sds.workloadcert import WorkloadCert
from control.model.proxy import proxy_from_node
from tests.support.controlplane import eventually
from tests.support.testca import TestCA
from tests.unit.test_sds_secrets import FAST


def proxy_only(tmp_path: Path, **kw: object) -> AgentConfig:
    return AgentConfig(workdir=tmp_path / "run", ip="127.0.7.1", proxy_only=True, **kw)  # type: ignore[arg-type]


def test_bootstrap_names_the_certificate_files_as_istio_does(tmp_path: Path) -> None:
    cfg = proxy_only(tmp_path, workload_cert_ttl=24 * 3600.0)
    boot = grpc_bootstrap(cfg)
    provider = boot["certificate_providers"]["default"]
    assert provider["plugin_name"] == "file_watcher"
    certs = (tmp_path / "run" / "certs").resolve()
    assert provider["config"] == {
        "certificate_file": str(certs / "cert-chain.pem"),
        "private_key_file": str(certs / "key.pem"),
        "ca_certificate_file": str(certs / "root-cert.pem"),
        "refresh_interval": "300s",
    }
    assert boot["server_listener_resource_name_template"] == "xds.istio.io/grpc/lds/inbound/%s"


def test_metadata_announces_the_provider_and_the_control_plane_reads_it(tmp_path: Path) -> None:
    cfg = proxy_only(tmp_path)
    meta = grpc_bootstrap(cfg)["node"]["metadata"]
    assert meta["CERTIFICATE_PROVIDER"] == "default"
    proxy = proxy_from_node(cfg.node_id, meta)
    assert proxy.is_grpc and proxy.cert_provider and proxy.as_workload().proxyless
    # The agent's own stream says the same (the two streams are one workload).
    assert cfg.node_metadata()["CERTIFICATE_PROVIDER"] == "default"
    assert "CERTIFICATE_PROVIDER" not in AgentConfig(workdir=tmp_path).node_metadata()


@pytest.mark.parametrize(
    ("ttl", "seconds"), [(24 * 3600.0, 300), (3600.0, 300), (600.0, 60), (20.0, 2), (3.0, 1)]
)
def test_refresh_interval(ttl: float, seconds: int) -> None:
    assert refresh_interval(ttl) == seconds


def issued(ca: TestCA) -> WorkloadCert:
    """A real certificate for a fresh key, as the secret manager would hold it."""
    kc = generate_key_and_csr("spiffe://cluster.local/ns/default/sa/app")
    chain = asyncio.run(ca.sign(kc.csr_pem, 3600))
    return workload_cert(chain, kc.key_pem, None)


def test_files_are_switched_together_with_a_private_key(tmp_path: Path) -> None:
    paths = CertPaths(tmp_path / "certs")
    ca = TestCA()
    first = issued(ca)
    write_cert_files(paths, first)
    assert paths.chain.read_bytes() == first.chain_pem
    assert paths.key.read_bytes() == first.key_pem
    assert paths.root.read_bytes() == first.root_pem
    assert paths.key.stat().st_mode & 0o777 == 0o600
    # The names go through `..data`, one symlink whose rename switches all three files.
    for p in (paths.chain, paths.key, paths.root):
        assert os.readlink(p) == f"..data/{p.name}"
    first_version = os.readlink(paths.directory / "..data")
    second = issued(ca)
    write_cert_files(paths, second)
    assert os.readlink(paths.directory / "..data") != first_version
    assert paths.key.read_bytes() == second.key_pem
    assert paths.chain.read_bytes() == second.chain_pem
    assert paths.key.stat().st_mode & 0o777 == 0o600
    # The old version is gone; nothing staged is left over.
    names = sorted(os.listdir(paths.directory))
    assert names == sorted(
        [
            "..data",
            os.readlink(paths.directory / "..data"),
            "cert-chain.pem",
            "key.pem",
            "root-cert.pem",
        ]
    )
    # The files belong together: the chain's leaf is for the key.
    leaf = x509.load_pem_x509_certificate(paths.chain.read_bytes())
    key = serialization.load_pem_private_key(paths.key.read_bytes(), None)
    der, fmt = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    assert leaf.public_key().public_bytes(der, fmt) == key.public_key().public_bytes(der, fmt)


def test_regular_files_from_before_become_links(tmp_path: Path) -> None:
    # A directory holding plain files (written by hand, or by an older agent) is taken over.
    paths = CertPaths(tmp_path / "certs")
    paths.directory.mkdir()
    paths.key.write_bytes(b"old")
    cert = issued(TestCA())
    write_cert_files(paths, cert)
    assert paths.key.is_symlink() and paths.key.read_bytes() == cert.key_pem
    # The same certificate written again (a restarted writer) leaves a consistent set.
    write_cert_files(paths, cert)
    assert paths.key.read_bytes() == cert.key_pem


async def test_writer_follows_rotations(tmp_path: Path) -> None:
    ca = TestCA()
    manager = SecretManager(
        ca, SdsConfig(namespace="default", service_account="app", cert_ttl=2, rotation=FAST)
    )
    paths = CertPaths(tmp_path / "certs")
    async with manager, CertFileWriter(manager, paths) as writer:
        assert await manager.wait_ready(10)
        await eventually(lambda: writer.current, timeout=10, what="first certificate on disk")
        serials: set[int] = set()

        def on_disk() -> bool:
            serials.add(x509.load_pem_x509_certificate(paths.chain.read_bytes()).serial_number)
            return len(serials) >= 3

        await eventually(on_disk, timeout=20, what="two rotations written")
        # Whatever is on disk was issued by the CA, and the writer keeps up with the manager.
        assert serials <= set(ca.issued)
        await eventually(lambda: writer.current, timeout=10)
        assert paths.key.read_bytes() == manager.current.key_pem  # type: ignore[union-attr]


async def test_writer_started_after_the_certificate_writes_it(tmp_path: Path) -> None:
    ca = TestCA()
    async with SecretManager(ca, SdsConfig(cert_ttl=3600, rotation=FAST)) as manager:
        assert await manager.wait_ready(10)
        async with CertFileWriter(manager, CertPaths(tmp_path / "c")) as writer:
            await eventually(lambda: writer.current, timeout=10, what="written")
            assert writer.writes == 1
