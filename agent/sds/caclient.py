"""The CA client: turns a CSR into a signed chain by calling the control plane's
`IstioCertificateService/CreateCertificate` on the agent's one upstream channel (the same
TCP connection as xDS). It satisfies the SDS side's `CertificateSigner` protocol:
`async def sign(csr_pem, ttl_seconds) -> list[str]`.

The bearer token is read from the token file on every request: over TLS the channel's call
credentials do it (on gRPC's thread); over plaintext this client does it (off the event loop)
and sends it as metadata, because gRPC never sends call credentials over plaintext."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path

import grpc

from agent.xdsproxy.upstream import UpstreamChannel, read_token
from protos import ca_pb2

logger = logging.getLogger(__name__)

CREATE_CERTIFICATE = "/istio.v1.auth.IstioCertificateService/CreateCertificate"

# Retrying cannot help these: the request or the credentials must change first.
_FINAL = frozenset(
    (
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNIMPLEMENTED,
    )
)


class CaClientError(Exception):
    """Signing failed; `retryable` says whether trying again later may succeed."""

    def __init__(
        self, message: str, *, retryable: bool, code: grpc.StatusCode | None = None
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.code = code


class CaClient:
    def __init__(
        self,
        upstream: UpstreamChannel,
        token_file: Path | None,
        *,
        timeout: float = 10.0,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """`metadata`: forwarded in the request (Istio's agents send e.g. ClusterID)."""
        self._upstream = upstream
        self._token_file = token_file
        self._timeout = timeout
        self._metadata = dict(metadata or {})

    async def sign(self, csr_pem: bytes, ttl_seconds: int) -> list[str]:
        """The PEM chain for `csr_pem`, leaf first and root last."""
        # Read afresh for every request: the token on disk may have been rotated.
        token = await asyncio.to_thread(read_token, self._token_file) if self._token_file else ""
        call_metadata = self._upstream.call_metadata(token)
        request = ca_pb2.IstioCertificateRequest(
            csr=csr_pem.decode(), validity_duration=int(ttl_seconds)
        )
        if self._metadata:
            request.metadata.update(self._metadata)
        method = self._upstream.channel.unary_unary(
            CREATE_CERTIFICATE,
            request_serializer=ca_pb2.IstioCertificateRequest.SerializeToString,
            response_deserializer=ca_pb2.IstioCertificateResponse.FromString,
        )
        try:
            response = await method(request, metadata=call_metadata, timeout=self._timeout)
        except grpc.aio.AioRpcError as e:
            code = e.code()
            hint = ""
            if code is grpc.StatusCode.UNAUTHENTICATED and self._token_file is not None:
                hint = f" (token file {self._token_file})"
            raise CaClientError(
                f"CreateCertificate failed: {code.name}: {e.details()}{hint}",
                retryable=code not in _FINAL,
                code=code,
            ) from None
        chain = list(response.cert_chain)
        if not chain:
            raise CaClientError("CreateCertificate returned an empty chain", retryable=True)
        return chain
