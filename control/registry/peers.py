"""The identities of connected proxies that no registry names, for the agents' peer table.

The standard metrics name a peer workload from the control plane's table of who runs at which
address under which principal (control/generate/peers.py). Registered workloads (WorkloadEntry,
WorkloadGroup members, Kubernetes pods) are in the mesh index; a sidecar or gateway that
connects without being registered is not, yet its peers must be able to name it as its own
metrics name itself (its node's pod name and labels: telemetry_metrics.workload_telemetry).
So every connected proxy that reports standard metrics is tracked here, under the namespace
and service account its stream authenticated as: never what its node claims about who it is,
and a plaintext stream (no identity) is not tracked at all.

Sans-IO: `connect` / `disconnect` say whether the set changed; the keeper (keeper.py) turns a
change into a push. A proxy stays while any of its streams is open.
"""

from __future__ import annotations

import collections

from control.ca.identity import Identity
from control.model.peer import ConnectedPeer
from control.model.proxy import Proxy


class ConnectedPeers:
    def __init__(self) -> None:
        self._streams: collections.Counter[ConnectedPeer] = collections.Counter()

    def connect(self, proxy: Proxy, identity: Identity | None) -> bool:
        """A stream of `proxy` opened; True when the set changed."""
        peer = _peer(proxy, identity)
        if peer is None:
            return False
        self._streams[peer] += 1
        return self._streams[peer] == 1

    def disconnect(self, proxy: Proxy, identity: Identity | None) -> bool:
        """A stream of `proxy` closed; True when the set changed (its last one)."""
        peer = _peer(proxy, identity)
        if peer is None or peer not in self._streams:
            return False
        self._streams[peer] -= 1
        if self._streams[peer] > 0:
            return False
        del self._streams[peer]
        return True

    def peers(self) -> tuple[ConnectedPeer, ...]:
        return tuple(sorted(self._streams))


def _peer(proxy: Proxy, identity: Identity | None) -> ConnectedPeer | None:
    # Only proxies whose agent reports standard metrics (proxyless gRPC and the connection
    # storms of fake proxies do not), so that a proxy that no peer names costs no push; and
    # only in the namespace the stream proved.
    if not proxy.als or proxy.is_grpc or identity is None or not proxy.ip:
        return None
    if identity.namespace != proxy.namespace:
        return None
    return ConnectedPeer(
        proxy.ip, proxy.namespace, proxy.pod_name, proxy.labels, identity.service_account
    )
