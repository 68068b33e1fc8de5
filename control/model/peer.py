"""A connected proxy as the agents' peer table names it (control/registry/peers.py tracks
them, control/generate/peers.py puts them in the table)."""

from __future__ import annotations

from dataclasses import dataclass

from control.model.types import Labels


@dataclass(frozen=True, slots=True, order=True)
class ConnectedPeer:
    """Its address, its node's pod name and labels, and the namespace and service account its
    stream authenticated as."""

    address: str
    namespace: str
    name: str
    labels: Labels
    service_account: str
