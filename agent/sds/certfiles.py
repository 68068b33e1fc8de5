"""The workload certificate as files, for proxyless gRPC: gRPC has no SDS, so its
`file_watcher` certificate provider (gRFC A29) reads the chain, the key and the root from files
that the agent keeps current, as Istio's agent does for proxyless pods (same file names).

Every certificate the secret manager installs (the first, each rotation) is written again.
Each file is replaced atomically (written beside it, then renamed over it), so a reader sees
the old or the new file, never a partial one; the key is 0600 from its creation. gRPC reads
the key and then the chain, so a refresh that falls between two renames can pair a new key
with the old chain; the renames follow each other directly to keep that window to
microseconds, and gRPC reads both again at its next refresh. Writing happens in a thread;
rotations that pile up while a write is under way collapse into one write of the latest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.sds.resources import WORKLOAD_CERT
from agent.sds.secrets import SecretManager, WorkloadCert

logger = logging.getLogger(__name__)

CERT_CHAIN_FILE: Final = "cert-chain.pem"
KEY_FILE: Final = "key.pem"
ROOT_CERT_FILE: Final = "root-cert.pem"


@dataclass(frozen=True, slots=True)
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


def write_cert_files(paths: CertPaths, cert: WorkloadCert) -> None:
    """Write chain, key and root, each atomically (blocking)."""
    paths.directory.mkdir(mode=0o750, parents=True, exist_ok=True)
    staged = [
        (_stage(paths.key, cert.key_pem, 0o600), paths.key),
        (_stage(paths.chain, cert.chain_pem, 0o644), paths.chain),
        (_stage(paths.root, cert.root_pem, 0o644), paths.root),
    ]
    # Everything is on disk before the first rename: the renames follow each other directly.
    for tmp, final in staged:
        os.replace(tmp, final)


def _stage(path: Path, data: bytes, mode: int) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # a leftover of a crash; O_EXCL below must create the file afresh
    # The mode is set at creation, so the key is never readable by others, not even briefly.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return tmp


class CertFileWriter:
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
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def __aenter__(self) -> CertFileWriter:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

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
