"""The workload certificate as the agent serves it (chain, key and root, as agent/sds/certcheck.py
checks them out of the CA's answer), and the counters of issuing it (with an observer for the
agent's metrics). No cryptography: the agent's process holds these without loading it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True, eq=False)
class WorkloadCert:
    """A signed workload certificate as served."""

    chain_pem: bytes  # leaf first, then intermediates (the root is served as ROOTCA)
    key_pem: bytes
    root_pem: bytes
    serial: int
    not_before: float  # wall-clock seconds
    not_after: float
    identity: str | None  # the leaf's SPIFFE URI SAN

    @property
    def serial_hex(self) -> str:
        """As Envoy's admin /certs shows it: lowercase hex, whole bytes."""
        h = format(self.serial, "x")
        return h if len(h) % 2 == 0 else "0" + h


class SdsObserver(Protocol):
    """Where certificate events go besides the plain counters (the agent's metrics)."""

    def sign_attempt(self) -> None: ...
    def cert_issued(self, not_after: float, *, rotation: bool) -> None: ...
    def signing_failed(self, *, retryable: bool) -> None: ...
    def file_secret_failed(self) -> None: ...


@dataclass(eq=False)
class SdsStats:
    """Counters of certificate signing and file-mounted secrets."""

    sign_attempts: int = 0
    certs_issued: int = 0
    rotations: int = 0  # certificates issued after the first
    signing_failures: int = 0
    file_secret_failures: int = 0
    observer: SdsObserver | None = None

    def on_attempt(self) -> None:
        self.sign_attempts += 1
        if self.observer is not None:
            self.observer.sign_attempt()

    def on_issued(self, not_after: float) -> None:
        rotation = self.certs_issued > 0
        self.certs_issued += 1
        self.rotations += rotation
        if self.observer is not None:
            self.observer.cert_issued(not_after, rotation=rotation)

    def on_failure(self, retryable: bool) -> None:
        self.signing_failures += 1
        if self.observer is not None:
            self.observer.signing_failed(retryable=retryable)

    def on_file_failure(self) -> None:
        self.file_secret_failures += 1
        if self.observer is not None:
            self.observer.file_secret_failed()
