"""Jittered exponential backoff and error classification, sans-IO."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import grpc


@dataclass
class Backoff:
    """Delays grow by `multiplier` up to `maximum`, each randomized by +-`jitter` (a
    fraction), so a fleet of agents that lost the same control plane does not reconnect in
    lockstep. `reset()` after a success."""

    initial: float = 0.5
    maximum: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random)
    _next: float = -1.0

    def next_delay(self) -> float:
        if self._next < 0:
            self._next = self.initial
        base = self._next
        self._next = min(self.maximum, self._next * self.multiplier)
        return max(0.0, base * (1 + self.rng.uniform(-self.jitter, self.jitter)))

    def reset(self) -> None:
        self._next = -1.0


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
