"""The control plane's security stack: the CA (self-signed in the state dir, plugged in from
files, or in memory), the token issuer and verifier, the call authenticator (bearer token,
client certificate, or Kubernetes TokenReview), the CA's gRPC service, and the serving
certificates of our own TLS listeners (the TLS gRPC ports and the webhook).

It decides who a caller is and what a stream may claim; the rest of the control plane asks
it (`authorize_stream`) and never handles key material itself. Key loading and generation
run in a worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import logging
import ssl
from dataclasses import dataclass

import grpc
from cryptography.hazmat.primitives.asymmetric import ec

from control.ca.authn import (
    Authenticator,
    AuthError,
    TokenIssuer,
    check_claim,
    load_or_create_token_key,
)
from control.ca.authority import (
    SERVING_VALIDITY,
    CaError,
    CaLimits,
    CertificateAuthority,
    authority_from_files,
    authority_from_state_dir,
    in_memory_authority,
)
from control.ca.grpcauth import STATUS, CallAuthenticator, is_secure
from control.ca.identity import Identity
from control.ca.service import CertificateService
from control.ca.serving import ServingCertificates
from control.kube.client import KubeClient
from control.kube.tokenreview import KubeTokenReviewer
from control.metrics import Metrics
from control.model.proxy import Proxy
from control.xds.server import StreamRefused
from pilotfish_common.addresses import is_ip
from pilotfish_common.lifecycle import Lifecycle

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SecurityOptions:
    """The security part of control.app.ControlPlaneOptions (the fields mean the same; the
    TLS addresses are its secure_xds_address and mtls_xds_address, "" = not served)."""

    trust_domain: str = "cluster.local"
    state_dir: str = ""  # "" = the CA root and the token key live in memory
    ca_cert: str = ""
    ca_key: str = ""
    ca_chain: str = ""
    max_workload_cert_ttl: float = 24 * 3600.0
    serving_cert_ttl: float = SERVING_VALIDITY.total_seconds()
    secure_address: str = ""
    mtls_address: str = ""
    replica_id: str = "pilotfish"  # one more name in our serving certificates
    # --revision: its Service (istiod-<rev>.istio-system.svc, where a revision's pods and the
    # API server reach it, as Istio names it) is one more name too.
    revision: str = ""

    @property
    def service_names(self) -> list[str]:
        names = ["istiod.istio-system.svc"]
        if self.revision:
            names.append(f"istiod-{self.revision}.istio-system.svc")
        return names


class SecurityStack(Lifecycle):
    """Owns the CA, the token key and our serving certificates; start() before use, or
    `async with`. The attributes are None until start()."""

    def __init__(
        self, options: SecurityOptions, metrics: Metrics, kube: KubeClient | None = None
    ) -> None:
        self.options = options
        self._metrics = metrics
        self._kube = kube  # Kubernetes mode: tokens are checked with TokenReview
        self.ca: CertificateAuthority | None = None
        # Tests and pilotfish-ctl mint tokens with the same key.
        self.tokens: TokenIssuer | None = None
        self.ca_service: CertificateService | None = None
        self.serving: ServingCertificates | None = None  # the TLS gRPC ports'
        self.webhook_serving: ServingCertificates | None = None
        self._call_auth: CallAuthenticator | None = None

    @property
    def call_auth(self) -> CallAuthenticator | None:
        """The authenticator of the gRPC ports (set by start()); the debug views check HTTP
        bearer tokens with it too."""
        return self._call_auth

    async def start(self) -> None:
        ca, tokens = await asyncio.to_thread(self._load)
        self.ca, self.tokens = ca, tokens
        self._metrics.root_expiry.set(ca.root.not_valid_after_utc.timestamp())
        reviewer = KubeTokenReviewer(self._kube) if self._kube is not None else None
        self._call_auth = CallAuthenticator(
            Authenticator(tokens.verifier(), self.options.trust_domain, reviewer)
        )
        self.ca_service = CertificateService(ca, self._call_auth, self._metrics)
        await self.ca_service.start()

    async def close(self) -> None:
        for serving in (self.serving, self.webhook_serving):
            if serving is not None:
                await serving.close()
        if self.ca_service is not None:
            await self.ca_service.close()
            self.ca_service = None

    def _load(self) -> tuple[CertificateAuthority, TokenIssuer]:
        """The CA and the token key (blocking; called through asyncio.to_thread)."""
        o = self.options
        limits = CaLimits(max_workload_ttl=o.max_workload_cert_ttl)
        if o.ca_cert or o.ca_key or o.ca_chain:
            if not (o.ca_cert and o.ca_key):
                raise CaError("a plugged-in CA needs both --ca-cert and --ca-key")
            ca = authority_from_files(
                o.ca_cert, o.ca_key, o.ca_chain or None, o.trust_domain, limits
            )
            logger.info("CA: plugged in from %s", o.ca_cert)
        elif o.state_dir:
            ca = authority_from_state_dir(o.state_dir, o.trust_domain, limits)
        else:
            ca = in_memory_authority(o.trust_domain, limits)
            logger.info("CA: in memory (no state dir)")
        if o.state_dir:
            try:
                key = load_or_create_token_key(o.state_dir)
            except (OSError, ValueError) as e:
                raise CaError(f"token key: {e}") from None
        else:
            key = ec.generate_private_key(ec.SECP256R1())
        return ca, TokenIssuer(key)

    # --- gRPC ------------------------------------------------------------------------------

    def add_to(self, server: grpc.aio.Server) -> None:
        """Serve the CA (IstioCertificateService) on `server`."""
        assert self.ca_service is not None, "start() first"
        self.ca_service.add_to(server)

    async def add_tls_ports(self, server: grpc.aio.Server) -> tuple[int, int]:
        """Listen on the TLS gRPC ports with a serving certificate from our CA; returns
        (secure port, mTLS port), 0 for a port that is not served."""
        o = self.options
        if not (o.secure_address or o.mtls_address):
            return 0, 0
        assert self.ca is not None, "start() first"
        hosts = [_host(a) for a in (o.secure_address, o.mtls_address) if a and _host(a)]
        ips = [h for h in hosts if is_ip(h) and not ipaddress.ip_address(h).is_unspecified]
        names = ["localhost", "pilotfish-control", *o.service_names, o.replica_id]
        names += [h for h in hosts if not is_ip(h)]
        self.serving = self._serving(names, ips)
        await self.serving.start()
        secure = mtls = 0
        if o.secure_address:
            creds = self.serving.grpc_credentials()
            secure = server.add_secure_port(o.secure_address, creds)
            if secure == 0:
                raise OSError(f"cannot listen on --secure-xds-address {o.secure_address}")
        if o.mtls_address:
            creds = self.serving.grpc_credentials(client_root_pem=self.ca.root_pem.encode())
            mtls = server.add_secure_port(o.mtls_address, creds)
            if mtls == 0:
                raise OSError(f"cannot listen on --mtls-xds-address {o.mtls_address}")
        return secure, mtls

    async def authorize_stream(
        self, context: grpc.aio.ServicerContext, proxy: Proxy
    ) -> Identity | None:
        """Streams on the TLS ports: the caller must authenticate and may only claim its own
        identity, which is returned (auto-registration is bound to it, and syncz over xDS
        shows it what --debug-allow lets it see); otherwise StreamRefused. The plaintext
        port serves anyone (local use and tests, as DESIGN says) but vouches for no one:
        None, even when a token is sent (over plaintext it can be read and replayed)."""
        if not is_secure(context):
            return None
        assert self._call_auth is not None
        try:
            identity = await self._call_auth.identity_async(context)
            check_claim(identity, proxy.namespace, proxy.service_account)
        except AuthError as e:
            self._metrics.xds_auth_failures.labels(e.denial.value).inc()
            raise StreamRefused(STATUS[e.denial], e.message) from None
        return identity

    # --- the webhook -----------------------------------------------------------------------

    async def webhook_ssl_context(self, address: str) -> ssl.SSLContext:
        """A TLS server context for the injection webhook at `address`, renewed in place."""
        assert self.ca is not None, "start() first"
        host = _host(address)
        ips = [host] if is_ip(host) and not ipaddress.ip_address(host).is_unspecified else []
        # The API server calls the webhook through the Service: istiod.istio-system.svc (or
        # the revision's).
        names = [*self.options.service_names, "localhost", self.options.replica_id]
        names += [host] if host and not is_ip(host) else []
        self.webhook_serving = self._serving(names, ips)
        await self.webhook_serving.start()
        return await self.webhook_serving.ssl_context()

    def _serving(self, names: list[str], ips: list[str]) -> ServingCertificates:
        assert self.ca is not None
        ttl = dt.timedelta(seconds=self.options.serving_cert_ttl)
        return ServingCertificates(self.ca, names, [*ips, "127.0.0.1"], ttl)


def _host(address: str) -> str:
    return address.rpartition(":")[0].strip("[]")
