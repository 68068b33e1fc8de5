"""The mesh's workloads for the node agents' standard metrics (`pilotfish.telemetry.v1.
PeerTable`, protos/peers.proto): who runs at which address, under which principal.

Why: no peer metadata travels in requests (protos/telemetry.py). With this table the client
side's agent names an upstream by the upstream host's address, and the server side's agent a
caller by the connection's source address, only when the peer's certificate names the
principal the table gives (agent/telemetry/peers.py): the address alone is never trusted, nor
anything the peer says.

The channel is the agent's own ADS stream (as the name table and the WorkloadGroup probe);
one resource, `peers`, built once per push and sent to the agents of proxies that report
standard metrics. Its rows: the registered workloads, and the connected proxies that report
standard metrics and are not registered (control/registry/peers.py), each as its own metrics
tags name it (telemetry_metrics.workload_telemetry: a registered workload by its registry,
another by its node, under the identity its stream authenticated as). A workload or such a
proxy that comes or goes changes it, as a workload changes EDS.
"""

from __future__ import annotations

from typing import Final

from control.generate.context import GenContext
from control.generate.telemetry_metrics import app_of, registered_identity, version_of
from control.model.proxy import Proxy
from control.model.types import spiffe_id
from control.xds.cache import EMPTY, ResourceSet
from protos import peers_pb2
from protos.typeurls import PEER_TABLE

RESOURCE_NAME: Final = "peers"
# (ip, workload, namespace, app, version, principal)
PeerRow = tuple[str, str, str, str, str, str]


def generate(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    if not proxy.als or proxy.is_grpc:
        return EMPTY
    return ctx.memo(("peer-table",), lambda: _table(ctx))


def _table(ctx: GenContext) -> ResourceSet:
    rows = rows_of(ctx)
    return ResourceSet([ctx.resource(PEER_TABLE, RESOURCE_NAME, rows, lambda: build(rows))])


def rows_of(ctx: GenContext) -> tuple[PeerRow, ...]:
    trust_domain = ctx.index.trust_domain
    rows: set[PeerRow] = set()
    registered: set[tuple[str, str]] = set()
    for w in ctx.index.workloads:
        if not w.address:
            continue
        registered.add((w.address, w.namespace))
        name, labels, account = registered_identity(w)
        principal = spiffe_id(trust_domain, w.namespace, account)
        rows.add((w.address, name, w.namespace, app_of(labels), version_of(labels), principal))
    for p in ctx.peers:
        # A registered proxy is its registry's workload, as in its own metrics.
        if (p.address, p.namespace) in registered:
            continue
        labels = dict(p.labels)
        principal = spiffe_id(trust_domain, p.namespace, p.service_account)
        rows.add((p.address, p.name, p.namespace, app_of(labels), version_of(labels), principal))
    return tuple(sorted(rows))


def build(rows: tuple[PeerRow, ...]) -> peers_pb2.PeerTable:
    return peers_pb2.PeerTable(
        peers=[
            peers_pb2.Peer(
                ip=ip, workload=name, namespace=ns, app=app, version=version, principal=principal
            )
            for ip, name, ns, app, version, principal in rows
        ]
    )
