"""Who a peer is, from the control plane's table of the mesh's workloads (sans-IO).

The control plane sends `pilotfish.telemetry.v1.PeerTable` (protos/peers.proto) on the
agent's own ADS stream; `PeerDirectory` is its handler. It names:

- a request's upstream (client side), by the upstream host's address;
- a caller (server side), by the connection's source address;

each only when the peer's certificate (mTLS) names the principal the table gives for that
address: an address alone proves nothing (a plaintext peer, or one whose certificate says
another identity, stays `unknown`), and nothing the peer sends is read. When no workload at
that address has that principal, the one workload of the table that has it is named (a
sidecar on a loopback alias calls from 127.0.0.1, a NATed caller from another address); with
two or more, the caller stays `unknown` (its certificate cannot say which). `updates` counts
the tables received, so that label sets computed from an older one can be forgotten.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Sequence
from typing import Final

from google.protobuf.message import Message

from protos import peers_pb2
from protos import telemetry as t

logger = logging.getLogger(__name__)

# One address held by more workloads than this (a misconfiguration) names none of them.
MAX_PER_ADDRESS: Final = 8
PeerFields = dict[str, str]


class PeerDirectory:
    """The newest table, by address; `__call__` is the xDS response handler."""

    def __init__(self) -> None:
        # address -> ((principal, fields), ...)
        self._by_address: dict[str, tuple[tuple[str, PeerFields], ...]] = {}
        # principal -> fields, for the principals exactly one workload has
        self._sole: dict[str, PeerFields] = {}
        self.updates = 0

    def __call__(self, resources: Sequence[Message]) -> None:
        by_address: dict[str, list[tuple[str, PeerFields]]] = {}
        for table in resources:
            if not isinstance(table, peers_pb2.PeerTable):
                raise TypeError(f"not a PeerTable: {type(table).__name__}")
            for p in table.peers:
                address = _normal(p.ip)
                if not address or not p.principal.startswith("spiffe://"):
                    continue
                fields = {
                    t.TAG_WORKLOAD: p.workload or "unknown",
                    t.TAG_NAMESPACE: p.namespace or "unknown",
                    t.TAG_APP: p.app or "unknown",
                    t.TAG_VERSION: p.version or "unknown",
                }
                by_address.setdefault(address, []).append((p.principal, fields))
        self._by_address = {
            a: tuple(entries)
            for a, entries in by_address.items()
            if len(entries) <= MAX_PER_ADDRESS
        }
        holders: dict[str, list[PeerFields]] = {}
        for entries in by_address.values():
            for principal, fields in entries:
                holders.setdefault(principal, []).append(fields)
        self._sole = {p: found[0] for p, found in holders.items() if len(found) == 1}
        self.updates += 1
        logger.debug("peer table: %d addresses", len(self._by_address))

    def __len__(self) -> int:
        return len(self._by_address)

    def workload_at(self, address: str, principal: str) -> PeerFields | None:
        """The workload at `address` whose principal is `principal` (the peer's certified
        SPIFFE ID), else the only workload with that principal, or None. Callers must not
        modify the result."""
        if not principal.startswith("spiffe://"):
            return None
        for known, fields in self._by_address.get(_normal(address), ()):
            if known == principal:
                return fields
        return self._sole.get(principal)


def _normal(address: str) -> str:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return ""
