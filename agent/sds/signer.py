"""What the secret manager needs from a certificate authority: sign a CSR.

The agent's CA client (caclient.py, `IstioCertificateService` over the upstream channel) is
one implementation; tests use a real in-process CA. The manager treats any exception from
`sign` as a failed attempt and reads its `retryable` attribute structurally (default True),
so a signer's own error type (e.g. `CaClientError`) needs no common base class.
"""

from __future__ import annotations

from typing import Protocol


class CertificateSigner(Protocol):
    async def sign(self, csr_pem: bytes, ttl_seconds: int) -> list[str]:
        """Sign `csr_pem` for about `ttl_seconds`; the PEM chain, leaf first, root last."""
        ...


class SigningError(Exception):
    """A signing attempt failed. `retryable` False means retrying soon will not help (e.g. the
    CA refused our credentials); the manager then retries only at its slowest pace, since a
    token or policy can be fixed without restarting the agent."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


def is_retryable(error: BaseException) -> bool:
    """The `retryable` attribute of any signer's error; errors without one are retryable
    (a dropped connection, a timeout)."""
    return bool(getattr(error, "retryable", True))
