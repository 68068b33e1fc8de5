"""`istio.v1.auth.IstioCertificateService/CreateCertificate` as a grpc.aio service: a thin
adapter that authenticates the caller, has the signing worker process sign (control/ca/signer.py)
and records Istio's citadel_server_* metrics. It is registered on every gRPC port but signs
only over TLS: on the plaintext port a bearer token can be read and replayed by anyone on the
path, and the certificate it would buy is an identity, so calls there are refused
(UNAUTHENTICATED) whatever credentials they carry."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

import grpc
from google.protobuf.message import DecodeError

from control.ca.authn import AuthError
from control.ca.authority import CertificateAuthority, CsrError
from control.ca.grpcauth import STATUS, CallAuthenticator, is_secure
from control.ca.signer import ProcessSigner, SignerFailed, SignerUnavailable
from control.metrics import Metrics
from pilotfish_common.lifecycle import Lifecycle
from protos import ca_pb2
from protos.rawcalls import bytes_in

SERVICE = "istio.v1.auth.IstioCertificateService"

logger = logging.getLogger(__name__)


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class CertificateService(Lifecycle):
    """Owns the signing worker: `start()` before serving, `close()` after the gRPC server
    has stopped (calls still being signed then finish first)."""

    def __init__(
        self,
        authority: CertificateAuthority,
        auth: CallAuthenticator,
        metrics: Metrics,
        clock: Callable[[], dt.datetime] = _utcnow,
    ) -> None:
        self.authority = authority
        self.auth = auth
        self.metrics = metrics
        self._clock = clock
        self.signer = ProcessSigner(authority, on_restart=metrics.signer_restarts.inc)

    async def start(self) -> None:
        await self.signer.start()

    async def close(self) -> None:
        await self.signer.close()

    def add_to(self, server: grpc.aio.Server) -> None:
        # Requests arrive as bytes and are decoded in `_create_raw` (see bytes_in: a request
        # that does not parse is the caller's INVALID_ARGUMENT, not gRPC's UNKNOWN).
        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "CreateCertificate": bytes_in(
                    grpc.unary_unary_rpc_method_handler,
                    self._create_raw,
                    ca_pb2.IstioCertificateResponse,
                )
            },
        )
        server.add_generic_rpc_handlers((handler,))

    async def _create_raw(
        self, raw: bytes, context: grpc.aio.ServicerContext
    ) -> ca_pb2.IstioCertificateResponse:
        try:
            request = ca_pb2.IstioCertificateRequest.FromString(raw)
        except DecodeError as e:
            self.metrics.csr_count.inc()
            self.metrics.csr_parse_errors.inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {e}")
            raise  # not reached: abort raises
        return await self.CreateCertificate(request, context)

    async def CreateCertificate(
        self, request: ca_pb2.IstioCertificateRequest, context: grpc.aio.ServicerContext
    ) -> ca_pb2.IstioCertificateResponse:
        m = self.metrics
        m.csr_count.inc()
        if not is_secure(context):
            m.csr_auth_errors.inc()
            logger.info("CreateCertificate from %s refused: plaintext port", context.peer())
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "certificates are not issued on the plaintext port; use the TLS port (15012)",
            )
        try:
            identity = await self.auth.identity_async(context)
        except AuthError as e:
            m.csr_auth_errors.inc()
            logger.info("CreateCertificate from %s refused: %s", context.peer(), e.message)
            await context.abort(STATUS[e.denial], e.message)
            raise  # not reached: abort raises
        try:
            chain = await self.signer.sign(
                request.csr.encode(), identity, float(request.validity_duration), self._clock()
            )
        except CsrError as e:
            m.csr_parse_errors.inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise
        except SignerUnavailable as e:
            m.csr_sign_errors.inc()
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
            raise
        except SignerFailed as e:
            m.csr_sign_errors.inc()
            logger.error("signing a certificate for %s failed: %s", identity, e)
            await context.abort(grpc.StatusCode.INTERNAL, "the CA failed to sign the CSR")
            raise
        except Exception:
            m.csr_sign_errors.inc()
            logger.exception("signing a certificate for %s failed", identity)
            await context.abort(grpc.StatusCode.INTERNAL, "the CA failed to sign the CSR")
            raise
        m.cert_issued.inc()
        logger.debug("signed a certificate for %s", identity)
        return ca_pb2.IstioCertificateResponse(cert_chain=chain)
