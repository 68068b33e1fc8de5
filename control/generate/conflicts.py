"""Listener and domain conflicts met while generating one push, for Istio's conflict gauges.

Two services that want the same listener cannot both have it: the generators keep the first
(by hostname) and record the loser here, once per push however many proxies share the
conflict. The push's count of each kind is what `pilot_conflict_*` shows.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable


class Conflict(enum.Enum):
    # Two services want the same inbound port of a workload with different protocols, or a
    # Sidecar declares an ingress port twice.
    INBOUND = "inbound"
    # A TCP service loses its port to another TCP service (nothing in plain TCP tells them
    # apart).
    TCP_OVER_TCP = "tcp_over_current_tcp"
    # A TCP service loses its port to an HTTP listener (HTTP always takes a shared port).
    TCP_OVER_HTTP = "tcp_over_current_http"
    # An HTTP domain already claimed by another service on the port.
    DUPLICATE_DOMAIN = "duplicate_domain"


class Conflicts:
    """The distinct conflicts of one push (keys name what lost, so proxies sharing a
    conflict count it once)."""

    def __init__(self) -> None:
        self._seen: dict[Conflict, set[Hashable]] = {}

    def add(self, kind: Conflict, key: Hashable) -> None:
        self._seen.setdefault(kind, set()).add(key)

    def count(self, kind: Conflict) -> int:
        return len(self._seen.get(kind, ()))
