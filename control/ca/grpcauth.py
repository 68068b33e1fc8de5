"""The gRPC side of authentication: pull the bearer token and the verified client certificate
out of a call and hand them to the sans-IO `Authenticator`."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from control.ca.authn import Authenticator, Denial
from control.ca.identity import Identity

STATUS = {
    Denial.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Denial.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
}


class CallAuthenticator:
    def __init__(self, authenticator: Authenticator, clock: Callable[[], float] = time.time):
        self.authenticator = authenticator
        self._clock = clock

    def identity(self, context: grpc.aio.ServicerContext) -> Identity:
        """The caller's identity, or AuthError. Only a certificate the TLS layer verified
        reaches the auth context (the mTLS port requires and checks it against our root)."""
        authorization = [
            v if isinstance(v, str) else v.decode("latin-1")
            for k, v in (context.invocation_metadata() or ())
            if k == "authorization"
        ]
        certs = context.auth_context().get("x509_pem_cert") or ()
        return self.authenticator.authenticate(
            authorization, certs[0] if certs else None, self._clock()
        )

    async def identity_async(self, context: grpc.aio.ServicerContext) -> Identity:
        """`identity`, asking the token reviewer (Kubernetes TokenReview) when one is set."""
        authorization = [
            v if isinstance(v, str) else v.decode("latin-1")
            for k, v in (context.invocation_metadata() or ())
            if k == "authorization"
        ]
        certs = context.auth_context().get("x509_pem_cert") or ()
        return await self.authenticator.authenticate_async(
            authorization, certs[0] if certs else None, self._clock()
        )


def is_secure(context: grpc.aio.ServicerContext) -> bool:
    """Whether the call came over TLS. Anything but an explicit insecure transport counts as
    secure, so an unknown transport gets authenticated rather than waved through."""
    kinds = context.auth_context().get("transport_security_type") or ()
    return not kinds or kinds[0] not in (b"insecure", "insecure")
