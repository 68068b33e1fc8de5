"""Classifying how a gRPC stream ended (expected vs unexpected), sans-IO."""

from __future__ import annotations

import grpc

# Ends of a stream that are part of normal life: the peer went away or restarted, a
# connection reached its maximum age, the stream was cancelled by us or the downstream.
_EXPECTED_DETAILS = (
    "goaway",
    "max_age",
    "max connection age",
    "eof",
    "socket closed",
    "connection reset",
    "failed to connect",
    "connection refused",
    "keepalive",
    "stream removed",
)


def classify(code: grpc.StatusCode | None, details: str = "") -> str:
    """'expected' or 'unexpected', for logs and metrics."""
    if code is None or code in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED):
        return "expected"
    if code is grpc.StatusCode.UNAVAILABLE:
        return "expected"
    lowered = details.lower()
    if code is grpc.StatusCode.INTERNAL and any(d in lowered for d in _EXPECTED_DETAILS):
        return "expected"
    return "unexpected"
