"""SecretManager (agent/sds/secrets.py) with a real CA: real keys, CSRs and certificates.

No sockets: the manager is driven through its API and watchers, as the SDS server uses it."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from agent.sds.files import FileSecretError
from agent.sds.firstsign import sign_new_key
from agent.sds.keys import KeyType
from agent.sds.keywork import ThreadKeyWork
from agent.sds.resources import ROOT_CERT, WORKLOAD_CERT
from agent.sds.rotation import RotationPolicy
from agent.sds.secrets import SdsConfig, SecretManager
from agent.sds.signer import SigningError
from agent.sds.workloadcert import SdsStats, WorkloadCert
from tests.support.controlplane import eventually
from tests.support.fresh import fresh_lines
from tests.support.testca import TestCA

ID = "spiffe://cluster.local/ns/shop/sa/cart"
FAST = RotationPolicy(min_delay=0.2, retry_initial=0.05, retry_max=0.2, retry_jitter=0.0)


def config(**kw: object) -> SdsConfig:
    base: dict[str, object] = {
        "namespace": "shop",
        "service_account": "cart",
        "rotation": FAST,
        "file_poll_interval": 0.05,
    }
    base.update(kw)
    return SdsConfig(**base)  # type: ignore[arg-type]


def spki(pem: bytes, *, key: bool) -> bytes:
    der, fmt = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key:
        return serialization.load_pem_private_key(pem, None).public_key().public_bytes(der, fmt)
    return x509.load_pem_x509_certificate(pem).public_key().public_bytes(der, fmt)


class Recorder:
    def __init__(self, manager: SecretManager) -> None:
        self.names: list[str] = []
        self.unwatch = manager.watch(self.names.append)


async def test_first_certificate_is_served_as_default_and_root_as_rootca() -> None:
    ca = TestCA()
    manager = SecretManager(ca, config(cert_ttl=3600))
    assert not manager.ready and manager.get(WORKLOAD_CERT) is None
    async with manager:
        assert await manager.wait_ready(10)
        cert = manager.current
        assert cert is not None
        assert ca.ttls == [3600]
        assert manager.serial is not None and int(manager.serial, 16) == ca.issued[0]
        assert len(manager.serial) % 2 == 0  # whole bytes, as Envoy's /certs prints serials
        assert cert.identity == ID
        assert cert.not_after - cert.not_before == 3600
        assert manager.expiry == cert.not_after

        default = manager.get(WORKLOAD_CERT)
        assert default is not None
        tls = default.secret().tls_certificate
        chain = x509.load_pem_x509_certificates(tls.certificate_chain.inline_bytes)
        # Leaf only: the root is served as ROOTCA, not inside the chain.
        assert [c.serial_number for c in chain] == [ca.issued[0]]
        assert spki(tls.private_key.inline_bytes, key=True) == spki(
            tls.certificate_chain.inline_bytes, key=False
        )
        rootca = manager.get(ROOT_CERT)
        assert rootca is not None
        assert rootca.secret().validation_context.trusted_ca.inline_bytes == ca.root_pem
        assert manager.stats.certs_issued == 1 and manager.stats.rotations == 0


async def test_rsa_keys_when_configured() -> None:
    ca = TestCA()
    async with SecretManager(ca, config(key_type=KeyType.RSA_2048)) as manager:
        assert await manager.wait_ready(10)
        default = manager.get(WORKLOAD_CERT)
        assert default is not None
        key_pem = default.secret().tls_certificate.private_key.inline_bytes
        assert serialization.load_pem_private_key(key_pem, None).key_size == 2048  # type: ignore[union-attr]


async def test_rotation_installs_a_new_key_and_certificate_and_notifies_watchers() -> None:
    ca = TestCA()
    manager = SecretManager(ca, config(cert_ttl=2))
    rec = Recorder(manager)
    async with manager:
        assert await manager.wait_ready(10)
        first = manager.current
        assert first is not None
        await eventually(lambda: manager.stats.rotations >= 2, timeout=20, what="two rotations")
        second = manager.current
        assert second is not None and second.serial != first.serial
        assert second.key_pem != first.key_pem  # a fresh key each time
        assert manager.serial is not None and int(manager.serial, 16) == ca.issued[-1]
        # Every rotation told the watchers about `default`; the root did not change.
        assert rec.names.count(WORKLOAD_CERT) == manager.stats.certs_issued
        assert rec.names.count(ROOT_CERT) == 1
    rec.unwatch()


async def test_rotate_now_renews_immediately() -> None:
    ca = TestCA()
    async with SecretManager(ca, config(cert_ttl=3600)) as manager:
        assert await manager.wait_ready(10)
        before = manager.serial
        manager.rotate_now()
        await eventually(lambda: manager.serial != before, what="rotation")
        assert manager.stats.rotations == 1


async def test_signing_failures_are_retried_with_backoff(caplog: pytest.LogCaptureFixture) -> None:
    ca = TestCA(failures=[SigningError("CA unavailable"), ConnectionError("refused")])
    async with SecretManager(ca, config()) as manager:
        assert await manager.wait_ready(10)
        assert ca.calls == 3
        assert manager.stats.signing_failures == 2
        assert manager.stats.sign_attempts == 3
        assert manager.last_error == ""
    assert "CA unavailable" in caplog.text


async def test_non_retryable_failure_is_an_error_and_still_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ca = TestCA(failures=[SigningError("token rejected", retryable=False)])
    with caplog.at_level(logging.ERROR, logger="agent.sds.secrets"):
        async with SecretManager(ca, config()) as manager:
            await eventually(lambda: manager.last_error == "token rejected", what="failure")
            assert not manager.ready
            assert await manager.wait_ready(10)
    assert any(r.levelno == logging.ERROR and "token rejected" in r.message for r in caplog.records)


async def test_a_hung_ca_times_out_and_is_retried() -> None:
    ca = TestCA()

    class Hangs:
        calls = 0

        async def sign(self, csr_pem: bytes, ttl_seconds: int) -> list[str]:
            self.calls += 1
            if self.calls == 1:
                await asyncio.sleep(3600)
            return await ca.sign(csr_pem, ttl_seconds)

    signer = Hangs()
    async with SecretManager(signer, config(sign_timeout=0.2)) as manager:
        assert await manager.wait_ready(10)
        assert signer.calls == 2 and manager.stats.signing_failures == 1


async def test_certificate_for_another_key_is_refused() -> None:
    ca = TestCA()

    class WrongKey:
        async def sign(self, csr_pem: bytes, ttl_seconds: int) -> list[str]:
            from agent.sds.keys import generate_key_and_csr

            return ca.sign_csr(generate_key_and_csr(ID).csr_pem, ttl_seconds)

    async with SecretManager(WrongKey(), config()) as manager:
        await eventually(lambda: "not for our key" in manager.last_error, what="refusal")
        assert not manager.ready and manager.get(WORKLOAD_CERT) is None


async def test_chain_without_root_needs_a_root_file(tmp_path: Path) -> None:
    ca = TestCA(include_root=False)
    async with SecretManager(ca, config()) as manager:
        await eventually(lambda: "no root" in manager.last_error, what="missing root")
        assert not manager.ready
    root_file = tmp_path / "root-cert.pem"
    root_file.write_bytes(ca.root_pem)
    async with SecretManager(ca, config(root_cert_file=root_file)) as manager:
        assert await manager.wait_ready(10)
        rootca = manager.get(ROOT_CERT)
        assert rootca is not None
        assert rootca.secret().validation_context.trusted_ca.inline_bytes == ca.root_pem


async def test_configured_root_file_wins_over_the_chain(tmp_path: Path) -> None:
    ca, other = TestCA(), TestCA(name="another root")
    root_file = tmp_path / "roots.pem"
    bundle = ca.root_pem + other.root_pem  # e.g. during a root migration
    root_file.write_bytes(bundle)
    async with SecretManager(ca, config(root_cert_file=root_file)) as manager:
        assert await manager.wait_ready(10)
        rootca = manager.get(ROOT_CERT)
        assert rootca is not None
        assert rootca.secret().validation_context.trusted_ca.inline_bytes == bundle


async def test_ready_only_while_the_certificate_is_valid() -> None:
    ca = TestCA()
    now = [time.time()]
    manager = SecretManager(ca, config(cert_ttl=3600), clock=lambda: now[0])
    async with manager:
        assert await manager.wait_ready(10)
        now[0] += 7200
        assert not manager.ready


async def test_stats_feed_an_observer() -> None:
    events: list[tuple[str, object]] = []

    class Observer:
        def sign_attempt(self) -> None:
            events.append(("attempt", None))

        def cert_issued(self, not_after: float, *, rotation: bool) -> None:
            events.append(("issued", rotation))

        def signing_failed(self, *, retryable: bool) -> None:
            events.append(("failed", retryable))

        def file_secret_failed(self) -> None:
            events.append(("file", None))

    ca = TestCA(failures=[SigningError("no", retryable=False)])
    stats = SdsStats(observer=Observer())
    async with SecretManager(ca, config(cert_ttl=3600), stats=stats) as manager:
        assert await manager.wait_ready(10)
        manager.rotate_now()
        await eventually(lambda: stats.rotations == 1, what="rotation")
    assert events == [
        ("attempt", None),
        ("failed", False),
        ("attempt", None),
        ("issued", False),
        ("attempt", None),
        ("issued", True),
    ]


# --- file-mounted secrets -------------------------------------------------------------------


def test_names_the_manager_serves() -> None:
    SecretManager.check_name(WORKLOAD_CERT)
    SecretManager.check_name(ROOT_CERT)
    SecretManager.check_name("file-cert:/etc/certs/cert.pem~/etc/certs/key.pem")
    SecretManager.check_name("file-root:/etc/certs/root.pem")
    for bad in ("other", "file-cert:/only-cert.pem", "file-root:", "file-cert:~/k.pem"):
        with pytest.raises(FileSecretError):
            SecretManager.check_name(bad)


async def test_file_cert_is_served_watched_and_released(tmp_path: Path) -> None:
    ca = TestCA()
    cert_path, key_path = ca.client_cert("spiffe://x/ns/a/sa/b").write(tmp_path, "tls")
    name = f"file-cert:{cert_path}~{key_path}"
    manager = SecretManager(ca, config(cert_ttl=3600))
    rec = Recorder(manager)
    async with manager:
        await manager.acquire(name)
        entry = manager.get(name)
        assert entry is not None
        tls = entry.secret().tls_certificate
        assert tls.certificate_chain.inline_bytes == cert_path.read_bytes()
        assert tls.private_key.inline_bytes == key_path.read_bytes()

        # Replaced (a rotation by whoever mounts the files): pushed to watchers.
        newer = ca.client_cert("spiffe://x/ns/a/sa/b")
        newer.write(tmp_path, "tls")
        await eventually(
            lambda: (e := manager.get(name)) is not None and e.version != entry.version,
            what="reload",
        )
        assert rec.names.count(name) == 2

        # A broken file keeps the last good version being served.
        cert_path.write_text("garbage")
        await eventually(lambda: manager.stats.file_secret_failures == 1, what="failure")
        current = manager.get(name)
        assert current is not None
        assert current.secret().tls_certificate.certificate_chain.inline_bytes == newer.cert_pem

        manager.release(name)
        assert manager.get(name) is None


async def test_file_cert_with_mismatched_key_waits_for_the_key(tmp_path: Path) -> None:
    ca = TestCA()
    cert_path, key_path = ca.client_cert("spiffe://x/ns/a/sa/b").write(tmp_path, "tls")
    other = ca.client_cert("spiffe://x/ns/a/sa/b")
    key_path.write_bytes(other.key_pem)  # half-way through a rotation
    name = f"file-cert:{cert_path}~{key_path}"
    async with SecretManager(ca, config(cert_ttl=3600)) as manager:
        await manager.acquire(name)
        assert manager.get(name) is None
        assert manager.stats.file_secret_failures == 1
        cert_path.write_bytes(other.cert_pem)
        await eventually(lambda: manager.get(name) is not None, what="consistent pair")


async def test_file_root_appears_when_the_file_does(tmp_path: Path) -> None:
    ca = TestCA()
    ca_path = tmp_path / "root.pem"
    name = f"file-root:{ca_path}"
    async with SecretManager(ca, config(cert_ttl=3600)) as manager:
        await manager.acquire(name)
        await manager.acquire(name)  # a second stream
        assert manager.get(name) is None
        ca_path.write_bytes(ca.root_pem)
        await eventually(lambda: manager.get(name) is not None, what="root file")
        entry = manager.get(name)
        assert entry is not None
        assert entry.secret().validation_context.trusted_ca.inline_bytes == ca.root_pem
        manager.release(name)
        assert manager.get(name) is not None  # the other stream still holds it
        manager.release(name)
        assert manager.get(name) is None


class HeldSigner:
    """Signs with a real CA, but hands the chain over only when the test releases it."""

    def __init__(self, ca: TestCA) -> None:
        self.ca = ca
        self.asked = asyncio.Event()
        self.answer: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        self.csr = b""

    async def sign(self, csr_pem: bytes, ttl_seconds: int) -> list[str]:
        self.csr = csr_pem
        self.asked.set()
        return await self.answer


async def test_close_while_the_certificate_arrives_stops_the_manager() -> None:
    # Regression: with asyncio.wait_for around the signing call, a cancellation landing as the
    # chain arrived was swallowed (Python 3.11), the loop installed the certificate and slept
    # until the next renewal, and close() hung (the SDS server's tests hung ~1 run in 10).
    ca = TestCA()
    signer = HeldSigner(ca)
    manager = SecretManager(signer, config(cert_ttl=3600))
    await manager.start()
    await asyncio.wait_for(signer.asked.wait(), 10)
    chain = await asyncio.to_thread(ca.sign_csr, signer.csr, 3600)
    signer.answer.set_result(chain)  # the chain arrives ...
    closing = asyncio.ensure_future(manager.close())  # ... and close() cancels, same moment
    done, _ = await asyncio.wait([closing], timeout=10)
    assert closing in done, "close() did not return: the rotation loop swallowed its cancellation"


async def test_an_attempt_started_before_the_manager_is_its_first() -> None:
    """agent/launch.py starts the first key, CSR and signing call before the manager exists;
    the manager installs that outcome as its first attempt, and signs nothing more."""
    ca = TestCA()
    first = asyncio.create_task(sign_new_key(ca, ThreadKeyWork(), ID, KeyType.EC_P256, 3600))
    await asyncio.wait_for(asyncio.shield(first), 10)  # done before the manager starts
    manager = SecretManager(ca, config(cert_ttl=7200), first=first)
    async with manager:
        assert await manager.wait_ready(10)
        assert ca.calls == 1 and ca.ttls == [3600]
        assert manager.stats.sign_attempts == 1 and manager.stats.certs_issued == 1
        default = manager.get(WORKLOAD_CERT)
        assert default is not None
        assert default.secret().tls_certificate.private_key.inline_bytes == first.result().key_pem
        # Renewals are the manager's own, with its own lifetime.
        manager.rotate_now()
        await eventually(lambda: ca.calls == 2, what="rotation")
        assert ca.ttls == [3600, 7200]


async def test_a_failed_first_attempt_is_retried_by_the_manager() -> None:
    ca = TestCA()

    async def refused() -> WorkloadCert:
        raise SigningError("CA unavailable")

    async with SecretManager(ca, config(), first=refused()) as manager:
        assert await manager.wait_ready(10)
        assert ca.calls == 1
        assert manager.stats.signing_failures == 1 and manager.stats.sign_attempts == 2


def test_file_secrets_reader_is_loaded_with_the_first_file_secret(tmp_path: Path) -> None:
    """agent/sds/files.py (certificate checks, dataclasses) is imported by the first
    `file-…` secret a stream asks for, not before: names are told apart without it
    (agent/sds/names.py). Run in a fresh interpreter, where nothing has imported it yet."""
    ca_path = tmp_path / "root.pem"
    ca_path.write_bytes(TestCA().root_pem)
    code = (
        "import asyncio, sys\n"
        "from agent.sds.secrets import SdsConfig, SecretManager\n"
        "from tests.support.testca import TestCA\n"
        "async def main():\n"
        f"    name = 'file-root:{ca_path}'\n"
        "    async with SecretManager(TestCA(), SdsConfig(cert_ttl=3600)) as manager:\n"
        "        SecretManager.check_name(name)\n"
        "        SecretManager.check_name('kubernetes://gw-cert', remote=True)\n"
        "        print('agent.sds.files' in sys.modules, 'agent.sds.fetch' in sys.modules)\n"
        "        await manager.acquire(name)\n"
        "        print('agent.sds.files' in sys.modules, manager.get(name) is not None)\n"
        "asyncio.run(main())\n"
    )
    assert fresh_lines(code)[:2] == ["False False", "True True"]
