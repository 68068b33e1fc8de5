"""xDS for proxyless gRPC clients (node metadata `GENERATOR: grpc`), as Istio's grpcgen serves
them. A gRPC channel to `xds:///echo.default.svc.cluster.local:7070` walks one chain:

    LDS  "echo.default.svc.cluster.local:7070"   api_listener HCM, RDS over ADS
    RDS  "echo.default.svc.cluster.local:7070"   one virtual host "*", prefix "/"
    CDS  "outbound|7070||echo.default.svc.cluster.local"   EDS over ADS (LOGICAL_DNS for DNS)
    EDS  "outbound|7070||echo.default.svc.cluster.local"   endpoints by locality, weighted

gRPC asks for the listener named exactly as the target it dialled, so every name a client may
dial for a service port gets a listener: the FQDN, and for a Kubernetes service `svc.ns.svc`,
`svc.ns` and (in the client's own namespace) `svc`, each with `:port`. Nothing is bound: an
api_listener is configuration for the client's own channel, so there is no address.

A gRPC xDS server (gRFC A36: `grpc.server(..., xds=True)`) asks for the listener named by
the bootstrap's `server_listener_resource_name_template` with the address it listens on:
`xds.istio.io/grpc/lds/inbound/10.0.0.5:8080` (Istio's template). It gets one for every
inbound port of its workload (the target ports of the services selecting it) at each
address it may listen on (its IPs, `0.0.0.0`, `[::]`): one filter chain holding an
HttpConnectionManager with a non-forwarding route (the server's own handlers answer), mTLS
or plaintext as PeerAuthentication says (see `proxyless_tls`), and the workload's
AuthorizationPolicies as RBAC HTTP filters before the router (gRFC A41), built by the same
code as the sidecars' (`control/generate/authz_rbac.py`): DENY, then ALLOW. Every matcher that code
emits is one gRPC evaluates: principals (the peer certificate's URI SAN, so nothing matches a
plaintext caller), `url_path` (the gRPC method, `/pkg.Service/Method`), `destination_port`,
headers (`:method` is always POST for gRPC), and and/or/not combinations.

mTLS (gRFC A29) comes from the bootstrap's `default` certificate provider, which the agent
points at the workload certificate files it writes; it is used only for proxies whose node
metadata says their bootstrap has it (gRPC rejects a whole response naming a provider it
lacks). A cluster is mTLS when every endpoint behind it accepts nothing else (auto mTLS
within what gRPC can do: no per-endpoint `transport_socket_matches`, no Istio ALPN), or when
a DestinationRule says ISTIO_MUTUAL; SIMPLE/MUTUAL origination with files cannot be said to
gRPC and stays plaintext with a warning.

The generators return every resource of the proxy's scope (Sidecar egress hosts); the ADS
state machines pick what the client subscribed to (gRPC always names what it wants).

Every resource is cached in its own "grpc" variant slot: an Envoy CLA or cluster with the same
name carries different bytes, and sharing a slot would make the two kinds of proxy evict each
other's bytes on every push (rule 8).

Split by concern: this module decides which names lead where (the listener names a client
gets and the cluster behind each); grpc_listeners builds LDS and RDS (client api_listeners,
xDS-server listeners with mTLS and RBAC); grpc_clusters builds CDS and EDS and decides each
cluster's transport security.

Memo keys of resource sets use id() of tuples that the push memo holds, which therefore stay
alive (and their ids unique) for the whole push, as in plans.outbound_plan.
"""

from __future__ import annotations

from typing import Final

from control.generate.context import GenContext
from control.generate.names import search_names
from control.generate.plans import OutboundCluster, outbound_plan
from control.generate.warn import warn_once
from control.model.proxy import Proxy
from control.model.types import (
    Protocol,
)

# Cache variant of every resource made here; see the module docstring.
VARIANT: Final = "grpc"

# (listener name, cluster): one name a client may dial and the cluster it leads to.
Target = tuple[str, OutboundCluster]


def serves(cluster: OutboundCluster) -> bool:
    """Ports a gRPC client can call through xDS: HTTP-family ones, and UNKNOWN (an unnamed
    Kubernetes port, the usual case for a plain gRPC service). Ports declared TCP, TLS or HTTPS
    are not offered: the owner said they are not plaintext HTTP/2. A wildcard host cannot be
    dialled, so it has no listener either."""
    protocol = cluster.port.protocol
    return (protocol.is_http or protocol is Protocol.UNKNOWN) and not (
        cluster.service.hostname.startswith("*")
    )


def grpc_clusters(ctx: GenContext, proxy: Proxy) -> tuple[OutboundCluster, ...]:
    plan = outbound_plan(ctx, proxy)
    return ctx.memo(
        ("grpc-clusters", id(plan.visible)),
        lambda: tuple(c for c in plan.clusters if serves(c)),
    )


def targets(ctx: GenContext, proxy: Proxy) -> tuple[Target, ...]:
    """Every listener name of the proxy's scope, with its cluster. Short names depend on the
    client's namespace, so this is shared per (namespace, scope)."""
    plan = outbound_plan(ctx, proxy)
    return ctx.memo(
        ("grpc-targets", proxy.namespace, id(plan.visible)),
        lambda: _claim(grpc_clusters(ctx, proxy), proxy.namespace),
    )


def _claim(clusters: tuple[OutboundCluster, ...], client_namespace: str) -> tuple[Target, ...]:
    """A name two services could answer to goes to the one whose hostname it is, else to the
    first by hostname, with a warning: one listener name can lead to one cluster only. FQDNs
    are unique (one Service per hostname), so every cluster keeps at least its own name."""
    owner: dict[str, OutboundCluster] = {}
    for cluster in clusters:
        owner[f"{cluster.service.hostname}:{cluster.port.port}"] = cluster
    for cluster in sorted(clusters, key=lambda c: (c.service.hostname, c.port.port)):
        port = cluster.port.port
        for host in search_names(cluster.service, client_namespace)[1:]:
            name = f"{host}:{port}"
            first = owner.setdefault(name, cluster)
            if first is not cluster:
                warn_once(
                    ("grpc-name-conflict", name, cluster.name, first.name),
                    "gRPC listener %s of %s is already taken by %s; left out",
                    name,
                    cluster.name,
                    first.name,
                )
    return tuple(sorted(owner.items()))
