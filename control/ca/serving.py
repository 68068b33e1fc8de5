"""The control plane's own TLS certificates (the TLS gRPC ports, the injection webhook), kept
fresh.

A serving certificate is issued from our CA at start and issued again at half its lifetime, so a
control plane that runs longer than its certificate — or under a plugged-in intermediate that
expires sooner, which caps every leaf — keeps presenting a valid one. Open connections keep the
certificate they were set up with; each new handshake gets the newest:

- gRPC: `grpc.dynamic_ssl_server_credentials` asks `_fetcher` at every handshake, and a newer
  key pair is handed over only when there is one;
- ssl (the webhook): the server's context has an SNI callback that points each new
  connection at the newest context. OpenSSL calls it for every ClientHello, with or without a
  server name.

The schedule is the plain function `renewal_time`; the asyncio task around it only sleeps and
swaps.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import ssl
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509

from control.ca.authority import SERVING_VALIDITY, CertificateAuthority
from pilotfish_common.lifecycle import Lifecycle
from pilotfish_common.tasks import cancel

logger = logging.getLogger(__name__)

# After a failed issue (a CA past its expiry), try again this much later.
RETRY_AFTER = dt.timedelta(seconds=60)
# Never renew more often than this, whatever the lifetime: a CA about to expire caps every new
# leaf near its own end, and renewing at half of a vanishing lifetime would spin.
MIN_RENEWAL_DELAY = dt.timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class ServingCert:
    chain: tuple[str, ...]  # PEM, leaf first, root last
    key: bytes  # PEM, PKCS#8
    serial: int
    not_before: dt.datetime
    not_after: dt.datetime

    @property
    def presented_chain(self) -> bytes:
        """Leaf and intermediates: clients already hold the root."""
        return "".join(self.chain[:-1] or self.chain).encode()


def renewal_time(cert: ServingCert, now: dt.datetime) -> dt.datetime:
    """When to issue the next certificate: half-way through this one's lifetime, and never
    sooner than MIN_RENEWAL_DELAY from `now`."""
    halfway = cert.not_before + (cert.not_after - cert.not_before) / 2
    return max(halfway, now + MIN_RENEWAL_DELAY)


def ssl_context_for(cert: ServingCert) -> ssl.SSLContext:
    """A server context for `cert`. `ssl` loads certificates only from files, so they pass
    through a private temporary directory (0700, key 0600) that is removed at once. Blocking:
    call through asyncio.to_thread."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="pilotfish-tls-") as tmp:
        cert_file, key_file = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
        cert_file.write_text("".join(cert.chain))
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(cert.key)
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


class ServingCertificates(Lifecycle):
    """One serving identity (a set of DNS names and IPs), re-issued at half its lifetime.

    `async with ServingCertificates(ca, names, ips)` or start() / close(). After start(),
    `current` is valid, and `grpc_credentials()` / `ssl_context()` give credentials that follow
    every renewal. `on_renewed` callbacks run on the event loop after each swap."""

    def __init__(
        self,
        ca: CertificateAuthority,
        dns_names: Sequence[str],
        ips: Sequence[str],
        validity: dt.timedelta = SERVING_VALIDITY,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self._ca = ca
        self._names = tuple(dns_names)
        self._ips = tuple(ips)
        self._validity = validity
        self._clock = clock
        self._current: ServingCert | None = None
        # The webhook's context, kept in step with `_current` (built off the loop).
        self._ssl: ssl.SSLContext | None = None
        self._task: asyncio.Task[None] | None = None
        self.renewals = 0
        self.on_renewed: list[Callable[[ServingCert], None]] = []

    @property
    def current(self) -> ServingCert:
        if self._current is None:
            raise RuntimeError("ServingCertificates.start() has not run")
        return self._current

    async def start(self) -> None:
        self._current = await asyncio.to_thread(self._issue)
        self._task = asyncio.create_task(self._renew_forever(), name="serving-cert-renewal")

    async def close(self) -> None:
        await cancel(self._task)
        self._task = None

    # --- credentials that follow renewals ----------------------------------------------------

    def grpc_credentials(self, client_root_pem: bytes | None = None) -> grpc.ServerCredentials:
        """Server credentials whose key pair follows renewals; with `client_root_pem`, clients
        must present a certificate that chains to it."""
        initial = self.current

        def config(cert: ServingCert) -> grpc.ServerCertificateConfiguration:
            return grpc.ssl_server_certificate_configuration(
                [(cert.key, cert.presented_chain)], root_certificates=client_root_pem
            )

        handed_over = initial.serial

        def fetcher() -> grpc.ServerCertificateConfiguration | None:
            # Runs on a gRPC core thread at each handshake: read one attribute, build a
            # configuration only on a change (None keeps the current one).
            nonlocal handed_over
            cert = self._current
            if cert is None or cert.serial == handed_over:
                return None
            handed_over = cert.serial
            return config(cert)

        return grpc.dynamic_ssl_server_credentials(
            config(initial), fetcher, require_client_authentication=client_root_pem is not None
        )

    async def ssl_context(self) -> ssl.SSLContext:
        """A server context for asyncio servers; new connections get the newest certificate."""
        if self._ssl is None:
            self._ssl = await asyncio.to_thread(ssl_context_for, self.current)
        serving = self._ssl

        def newest(sslobj: ssl.SSLObject, _name: str | None, ctx: ssl.SSLContext) -> None:
            if self._ssl is not None and self._ssl is not ctx:
                sslobj.context = self._ssl

        serving.sni_callback = newest
        return serving

    # --- renewal ---------------------------------------------------------------------------

    def _issue(self) -> ServingCert:
        """Blocking (key generation and signing): call through asyncio.to_thread."""
        chain, key = self._ca.issue_serving_cert(
            self._names, self._ips, self._clock(), self._validity
        )
        leaf = x509.load_pem_x509_certificate(chain[0].encode())
        return ServingCert(
            tuple(chain),
            key,
            leaf.serial_number,
            leaf.not_valid_before_utc,
            leaf.not_valid_after_utc,
        )

    async def _renew_forever(self) -> None:
        while True:
            now = self._clock()
            await asyncio.sleep((renewal_time(self.current, now) - now).total_seconds())
            try:
                cert = await asyncio.to_thread(self._issue)
                context = await asyncio.to_thread(ssl_context_for, cert) if self._ssl else None
            except (ValueError, OSError, ssl.SSLError) as e:
                logger.error(
                    "serving certificate for %s not renewed (%s); retrying in %ds",
                    self._names[0] if self._names else "?",
                    e,
                    RETRY_AFTER.total_seconds(),
                )
                await asyncio.sleep(RETRY_AFTER.total_seconds())
                continue
            self._current = cert
            if context is not None:
                self._ssl = context
            self.renewals += 1
            logger.info(
                "serving certificate renewed: serial %x, valid until %s",
                cert.serial,
                cert.not_after.isoformat(),
            )
            for callback in self.on_renewed:
                callback(cert)
