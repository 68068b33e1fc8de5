"""The workload certificate as files, for proxyless gRPC: gRPC has no SDS, so its
`file_watcher` certificate provider (gRFC A29) reads the chain, the key and the root from files
that the agent keeps current, as Istio's agent does for proxyless pods (same file names).

Every certificate the secret manager installs (the first, each rotation) is written again,
the three files switched at once, as Kubernetes switches a secret volume: each version goes
into a directory of its own, `..data` is a symlink to the current one, and `cert-chain.pem`,
`key.pem`, `root-cert.pem` are symlinks through `..data`. One rename of `..data` replaces all
three together, so a reader never pairs a new key with an old chain (gRPC reads the key, then
the chain, and compares modification times around that to catch a change in between; a change
made by two renames could fall around its whole read). The key is 0600 from its creation.
Writing happens in a thread; rotations that pile up while a write is under way collapse into
one write of the latest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.sds.resources import WORKLOAD_CERT
from agent.sds.secrets import SecretManager
from agent.sds.workloadcert import WorkloadCert
from pilotfish_common.lifecycle import Lifecycle
from pilotfish_common.tasks import cancel

logger = logging.getLogger(__name__)

CERT_CHAIN_FILE: Final = "cert-chain.pem"
KEY_FILE: Final = "key.pem"
ROOT_CERT_FILE: Final = "root-cert.pem"


@dataclass(frozen=True, slots=True, eq=False)
class CertPaths:
    """Where the files live (Istio's names, in one directory)."""

    directory: Path

    @property
    def chain(self) -> Path:
        return self.directory / CERT_CHAIN_FILE

    @property
    def key(self) -> Path:
        return self.directory / KEY_FILE

    @property
    def root(self) -> Path:
        return self.directory / ROOT_CERT_FILE


def refresh_interval(cert_ttl: float) -> int:
    """How often gRPC should re-read the files, in whole seconds (its unit; 1 s at least).
    The agent renews at about half the lifetime, so a tenth of it leaves gRPC many chances
    to pick the new certificate up before the old one expires; 5 minutes at most, Istio's
    order of magnitude for day-long certificates."""
    return max(1, min(300, int(cert_ttl / 10)))


DATA_LINK: Final = "..data"


def write_cert_files(paths: CertPaths, cert: WorkloadCert) -> None:
    """Write chain, key and root as a new version and switch to it atomically (blocking)."""
    top = paths.directory
    top.mkdir(mode=0o750, parents=True, exist_ok=True)
    # Unique even when one certificate is written twice: the live version is never touched.
    version = f"..{cert.serial_hex}-{time.time_ns()}"
    staging = top / version
    staging.mkdir(mode=0o750)
    _write(staging / KEY_FILE, cert.key_pem, 0o600)
    _write(staging / CERT_CHAIN_FILE, cert.chain_pem, 0o644)
    _write(staging / ROOT_CERT_FILE, cert.root_pem, 0o644)
    _fsync_dir(staging)
    _link(top / DATA_LINK, version)
    for name in (KEY_FILE, CERT_CHAIN_FILE, ROOT_CERT_FILE):
        link = top / name
        if not link.is_symlink():
            _link(link, f"{DATA_LINK}/{name}")
    _fsync_dir(top)
    for old in top.iterdir():
        if old.name.startswith("..") and old.name not in (DATA_LINK, version):
            # Readers that opened an old file keep reading it; new opens see the new version.
            # shutil here only (with bz2 and lzma behind it): the first write, on the way to
            # ready, has no old version.
            import shutil

            shutil.rmtree(old, ignore_errors=True)


def _write(path: Path, data: bytes, mode: int) -> None:
    # The mode is set at creation, so the key is never readable by others, not even briefly.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _link(path: Path, target: str) -> None:
    """Make `path` a symlink to `target`, replacing whatever is there in one rename."""
    tmp = path.with_name(f"{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CertFileWriter(Lifecycle):
    """Keeps the files equal to the secret manager's current workload certificate."""

    def __init__(self, secrets: SecretManager, paths: CertPaths) -> None:
        self._secrets = secrets
        self.paths = paths
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._unwatch: Callable[[], None] | None = None
        # The serial of the certificate on disk (None: nothing written yet).
        self.written_serial: str | None = None
        self.writes = 0
        self.last_error = ""

    @property
    def current(self) -> bool:
        """The files hold the certificate the agent holds."""
        serial = self._secrets.serial
        return serial is not None and serial == self.written_serial

    async def start(self) -> None:
        self._unwatch = self._secrets.watch(self._on_secret)
        self._task = asyncio.create_task(self._run(), name="grpc-cert-files")
        if self._secrets.current is not None:
            self._wake.set()

    async def close(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        await cancel(self._task)
        self._task = None

    def _on_secret(self, name: str) -> None:
        if name == WORKLOAD_CERT:
            self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            cert = self._secrets.current
            if cert is None or cert.serial_hex == self.written_serial:
                continue
            try:
                await asyncio.to_thread(write_cert_files, self.paths, cert)
            except OSError as e:
                self.last_error = f"cannot write {e.filename}: {e.strerror}"
                logger.error("gRPC certificate files: %s (retrying in 5s)", self.last_error)
                await asyncio.sleep(5)
                self._wake.set()
                continue
            self.written_serial = cert.serial_hex
            self.writes += 1
            self.last_error = ""
            logger.info(
                "gRPC certificate files written to %s (serial %s)",
                self.paths.directory,
                cert.serial_hex,
            )
