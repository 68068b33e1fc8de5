"""LDS for interception mode NONE: every listener is bound to a real address, because no
iptables rule will steer traffic to a catch-all port.

- outbound: one listener per service port number among the visible services, at
  `<egress bind or pod IP>:<port>`. HTTP services on the port share an HttpConnectionManager
  whose routes (RDS `"<port>"`) pick the service by Host; otherwise TLS services are told apart
  by SNI and one plain TCP service takes the rest.
- inbound: one listener per Sidecar ingress port, at `<ingress bind or pod IP>:<port>`,
  forwarding to the `inbound|PORT||` cluster, with mTLS as the workload's PeerAuthentication
  says (for a proxy with SDS) and its AuthorizationPolicies as RBAC filters.

Listeners are named `<address>_<port>` like Istio's, which with the default bind is
`<pod IP>_<port>`. An inbound and an outbound listener on the same address and port cannot both
bind; the inbound one wins because it is the only way into the app.
"""

from __future__ import annotations

from envoy.config.core.v3.base_pb2 import TrafficDirection
from envoy.config.listener.v3.listener_components_pb2 import (
    Filter,
    FilterChain,
    FilterChainMatch,
    ListenerFilter,
)
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.route.v3.route_components_pb2 import (
    RouteAction,
)
from envoy.extensions.filters.listener.tls_inspector.v3.tls_inspector_pb2 import TlsInspector
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
    HttpFilter,
)
from envoy.extensions.filters.network.tcp_proxy.v3.tcp_proxy_pb2 import TcpProxy
from envoy.type.v3.hash_policy_pb2 import HashPolicy
from google.protobuf.duration_pb2 import Duration
from google.protobuf.wrappers_pb2 import BoolValue

from control.generate.addresses import socket_address
from control.generate.authz_rbac import http_filters as http_rbac_filters
from control.generate.authz_rbac import network_filters as network_rbac_filters
from control.generate.conflicts import Conflict
from control.generate.context import GenContext, variant_resource
from control.generate.filters import (
    TCP_PROXY_FILTER,
    TLS_INSPECTOR_FILTER,
    catch_all_routes,
    hcm_filter,
    sidecar_hcm,
    tcp_proxy,
)
from control.generate.listener_telemetry import (
    NONE,
    ListenerTelemetry,
    listener_telemetry,
    with_telemetry,
)
from control.generate.mesh_tls import MESH_ALPN_MATCH, downstream_socket
from control.generate.plans import (
    InboundPort,
    OutboundCluster,
    OutboundPort,
    destination_cluster,
    destination_port,
    egress_bind,
    inbound_ports,
    outbound_plan,
    sidecar_of,
)
from control.generate.resource_names import LISTENER_TYPE, inbound_cluster_name, listener_name
from control.generate.route_translation import add_route_filters
from control.generate.telemetry_metrics import (
    WorkloadTelemetry,
    instrument_listener,
    workload_telemetry,
)
from control.generate.warn import warn_once
from control.generate.wire import ads_config_source, pack
from control.model.index import MeshIndex
from control.model.proxy import Proxy
from control.model.telemetry import WorkloadMode
from control.model.traffic import Destination, TrafficPolicy
from control.model.types import AuthorizationPolicy, MtlsMode
from control.xds.cache import Resource, ResourceSet

# Where a TCP proxy sends a connection: (cluster, weight) pairs (one pair: that cluster), and
# whether to hash on the source IP (a DestinationRule consistentHash useSourceIp).
TcpTargets = tuple[tuple[tuple[str, int], ...], bool]
# A TCP-ish listener's filter chains: (SNI server names, targets); no names = the default chain.
Chains = tuple[tuple[tuple[str, ...], TcpTargets], ...]


def generate(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    plan = outbound_plan(ctx, proxy)
    sidecar = sidecar_of(ctx, proxy)
    resources: list[Resource] = []
    taken: set[tuple[str, int]] = set()
    peer = ctx.index.peer_policy(proxy.namespace, proxy.labels)
    policies = ctx.index.authorization_policies(proxy.namespace, proxy.labels)
    server = listener_telemetry(ctx, proxy, WorkloadMode.SERVER)
    client = listener_telemetry(ctx, proxy, WorkloadMode.CLIENT)
    telemetry = workload_telemetry(ctx, proxy)
    for inbound in inbound_ports(ctx, proxy):
        taken.add((inbound.bind, inbound.number))
        mode = peer.mode_for(inbound.number)
        if not proxy.sds:
            # Without certificates the proxy cannot terminate mTLS. STRICT then means "refuse
            # everything" (fail closed, no listener); otherwise it serves plaintext, which is
            # also all its peers send it (auto mTLS sees it without a sidecar).
            if mode is MtlsMode.STRICT:
                warn_once(
                    ("strict-without-sds", proxy.id, inbound.number),
                    "proxy %s: inbound port %d is STRICT mTLS but the proxy has no SDS "
                    "(node metadata SDS); the port is not served",
                    proxy.id,
                    inbound.number,
                )
                continue
            mode = MtlsMode.DISABLE
        resources.append(_inbound(ctx, inbound, mode, policies, server, telemetry))
    for port in plan.ports:
        bind = egress_bind(sidecar, port.number, proxy.ip)
        if (bind, port.number) in taken:
            warn_once(
                ("listener-conflict", proxy.id, bind, port.number),
                "proxy %s: outbound listener %s:%d skipped: a Sidecar ingress listener binds "
                "the same address",
                proxy.id,
                bind,
                port.number,
            )
            continue
        resources.append(_outbound(ctx, port, bind, plan.scope, client, telemetry))
    return ResourceSet(resources)


def _outbound(
    ctx: GenContext,
    port: OutboundPort,
    bind: str,
    scope: str,
    tel: ListenerTelemetry = NONE,
    telemetry: WorkloadTelemetry | None = None,
) -> Resource:
    name = listener_name(bind, port.number)
    _record_conflicts(ctx, port)
    if port.http:
        # Everything else an HTTP listener needs comes from RDS, so the address is all it reads.
        http_key = (bind, port.number)
        return variant_resource(
            ctx,
            LISTENER_TYPE,
            name,
            ("http", *http_key, tel, telemetry),
            lambda: instrument_listener(
                with_telemetry(build_outbound_http(*http_key), tel), telemetry
            ),
        )
    # The plan lives in the push memo, so id(port) cannot be reused during the push.
    chains = ctx.memo(("lds-chains", id(port), scope), lambda: tcp_chains(port, ctx.index, scope))
    tcp_key = (bind, port.number, chains)
    return variant_resource(
        ctx,
        LISTENER_TYPE,
        name,
        ("tcp", *tcp_key, tel, telemetry),
        lambda: instrument_listener(with_telemetry(build_outbound_tcp(*tcp_key), tel), telemetry),
    )


def _record_conflicts(ctx: GenContext, port: OutboundPort) -> None:
    """The TCP services that get no listener here: with an HTTP service on the port, all of
    them (HTTP takes the port); otherwise every one but the first by hostname (tcp_chains)."""
    if not port.tcp:
        return
    if port.http:
        for c in port.tcp:
            ctx.conflicts.add(Conflict.TCP_OVER_HTTP, (port.number, c.service.hostname))
        return
    first = min(port.tcp, key=lambda c: c.service.hostname)
    for c in port.tcp:
        if c is not first:
            ctx.conflicts.add(Conflict.TCP_OVER_TCP, (port.number, c.service.hostname))


def tcp_chains(port: OutboundPort, index: MeshIndex | None = None, scope: str = "") -> Chains:
    """TLS services get chains matched on SNI (tls_chains). Plain TCP carries nothing to tell
    services apart, so the first by hostname takes the default chain and the others are not
    reachable on this port (as with any two servers that want the same address). The default
    chain follows the service's VirtualService `tcp` routes (weighted destinations)."""
    chains = list(tls_chains(port, index, scope))
    if port.tcp:
        first = min(port.tcp, key=lambda c: c.service.hostname)
        chains.append(((), tcp_targets(first, port.number, index, scope)))
    return tuple(chains)


def tls_chains(port: OutboundPort, index: MeshIndex | None = None, scope: str = "") -> Chains:
    """A port's chains for its TLS services, matched on SNI: each service's VirtualService
    `tls` routes (a route's `sniHosts` to its weighted destinations), and the service's
    hostname to the service unless a route took it. A server name already taken on the port
    (by a service or route earlier by hostname) stays with it: Envoy refuses a listener
    whose chains match alike."""
    chains: list[tuple[tuple[str, ...], TcpTargets]] = []
    taken: set[str] = set()
    for c in sorted(port.tls, key=lambda c: c.service.hostname):
        vs = index.virtual_service(c.service.hostname, scope) if index is not None else None
        routes = [r for r in vs.tls if not r.ports or port.number in r.ports] if vs else []
        wanted = [(r.sni_hosts, r.destinations) for r in routes]
        if not any(c.service.hostname in names for names, _ in wanted):
            wanted.append(((c.service.hostname,), ()))
        for names, destinations in wanted:
            free = tuple(n for n in names if n not in taken)
            if not free:
                continue
            taken.update(free)
            if destinations and index is not None:
                chains.append((free, _route_targets(c, destinations, port.number, index, scope)))
            else:
                chains.append((free, (((c.name, 0),), False)))
    return tuple(chains)


def tcp_targets(
    cluster: OutboundCluster, number: int, index: MeshIndex | None, scope: str
) -> TcpTargets:
    """Where a plain TCP service's connections go: its VirtualService's first `tcp` route for
    the port (weighted destinations), else the service itself."""
    vs = index.virtual_service(cluster.service.hostname, scope) if index is not None else None
    route = (
        next((r for r in vs.tcp if not r.ports or number in r.ports), None)
        if vs is not None
        else None
    )
    if index is None or route is None:
        return (((cluster.name, 0),), _source_ip_hash(cluster.policy))
    return _route_targets(cluster, route.destinations, number, index, scope)


def _route_targets(
    cluster: OutboundCluster,
    destinations: tuple[Destination, ...],
    number: int,
    index: MeshIndex,
    scope: str,
) -> TcpTargets:
    """A TCP or TLS route's weighted clusters, hashed by source IP when the first
    destination's DestinationRule says so."""
    source_ip = _source_ip_hash(cluster.policy)
    targets = tuple((destination_cluster(index, d, number), d.weight) for d in destinations)
    first = destinations[0]
    rule = index.destination_rule(first.host, scope)
    if rule is not None:
        source_ip = _source_ip_hash(
            rule.effective_policy(destination_port(index, first, number), first.subset)
        )
    return (targets, source_ip)


def _source_ip_hash(policy: TrafficPolicy | None) -> bool:
    lb = policy.load_balancer if policy is not None else None
    return bool(lb and lb.consistent_hash and lb.consistent_hash.source_ip)


def _inbound(
    ctx: GenContext,
    port: InboundPort,
    mode: MtlsMode,
    policies: tuple[AuthorizationPolicy, ...],
    tel: ListenerTelemetry = NONE,
    telemetry: WorkloadTelemetry | None = None,
) -> Resource:
    key = (port.bind, port.number, port.protocol.is_http, mode, policies)
    return variant_resource(
        ctx,
        LISTENER_TYPE,
        port.listener,
        (*key, tel, telemetry),
        lambda: instrument_listener(with_telemetry(build_inbound(*key), tel), telemetry),
    )


# --- pure builders ---------------------------------------------------------------------------


def build_outbound_http(bind: str, number: int) -> Listener:
    hcm = sidecar_hcm(f"outbound_{bind}_{number}")
    add_route_filters(hcm)
    hcm.rds.config_source.CopyFrom(ads_config_source())
    hcm.rds.route_config_name = str(number)
    return Listener(
        name=listener_name(bind, number),
        address=socket_address(bind, number),
        filter_chains=[FilterChain(filters=[hcm_filter(hcm)])],
        traffic_direction=TrafficDirection.OUTBOUND,
    )


def build_outbound_tcp(bind: str, number: int, chains: Chains) -> Listener:
    listener = Listener(
        name=listener_name(bind, number),
        address=socket_address(bind, number),
        traffic_direction=TrafficDirection.OUTBOUND,
    )
    for server_names, (targets, source_ip) in chains:
        chain = FilterChain(filters=[weighted_tcp_proxy(targets, source_ip, number)])
        if server_names:
            chain.filter_chain_match.CopyFrom(
                FilterChainMatch(server_names=list(server_names), transport_protocol="tls")
            )
        listener.filter_chains.append(chain)
    if any(server_names for server_names, _ in chains):
        listener.listener_filters.append(
            ListenerFilter(name=TLS_INSPECTOR_FILTER, typed_config=pack(TlsInspector()))
        )
    return listener


def build_inbound(
    bind: str,
    number: int,
    http: bool,
    mode: MtlsMode = MtlsMode.DISABLE,
    policies: tuple[AuthorizationPolicy, ...] = (),
) -> Listener:
    """An inbound listener as the workload's PeerAuthentication says: STRICT has one mTLS
    chain (a plaintext client fails the handshake), DISABLE one plaintext chain, PERMISSIVE
    both, told apart by the TLS inspector: mesh mTLS (TLS offering Istio's ALPN) or anything
    else as plaintext (which lets an app's own TLS through to a TCP port, as in Istio)."""
    listener = Listener(
        name=listener_name(bind, number),
        address=socket_address(bind, number),
        traffic_direction=TrafficDirection.INBOUND,
    )
    if mode in (MtlsMode.STRICT, MtlsMode.PERMISSIVE):
        chain = FilterChain(
            name="mtls",
            filters=_inbound_filters(bind, number, http, policies, mtls=True),
            transport_socket=downstream_socket(),
        )
        if mode is MtlsMode.PERMISSIVE:
            chain.filter_chain_match.CopyFrom(
                FilterChainMatch(
                    transport_protocol="tls", application_protocols=list(MESH_ALPN_MATCH)
                )
            )
        listener.filter_chains.append(chain)
    if mode in (MtlsMode.DISABLE, MtlsMode.PERMISSIVE):
        listener.filter_chains.append(
            FilterChain(
                name="plaintext",
                filters=_inbound_filters(bind, number, http, policies, mtls=False),
            )
        )
    if mode is MtlsMode.PERMISSIVE:
        listener.listener_filters.append(
            ListenerFilter(name=TLS_INSPECTOR_FILTER, typed_config=pack(TlsInspector()))
        )
    return listener


def _inbound_filters(
    bind: str, number: int, http: bool, policies: tuple[AuthorizationPolicy, ...], *, mtls: bool
) -> list[Filter]:
    cluster = inbound_cluster_name(number)
    if not http:
        # Network RBAC filters go before the TCP proxy, which is terminal.
        rbac = network_rbac_filters(policies, f"inbound_{bind}_{number}")
        return [Filter(name=n, typed_config=pack(cfg)) for n, cfg in rbac] + [tcp_proxy(cluster)]
    hcm = sidecar_hcm(f"inbound_{bind}_{number}")
    if mtls:
        # The app learns who called: `x-forwarded-client-cert: By=<us>;Hash=..;URI=<caller>`.
        # Whatever a client sent in that header is replaced (SANITIZE_SET); on the plaintext
        # chain the default (SANITIZE) drops it, so it cannot be forged from outside the mesh.
        hcm.forward_client_cert_details = HttpConnectionManager.SANITIZE_SET
        hcm.set_current_client_cert_details.uri = True
    rbac = [HttpFilter(name=n, typed_config=pack(cfg)) for n, cfg in http_rbac_filters(policies)]
    # The router must stay last: filters after it never run.
    router = hcm.http_filters.pop()
    hcm.http_filters.extend([*rbac, router])
    # Inline: the route is fixed (everything to the app), so an RDS round trip would only
    # delay the listener becoming ready.
    routes = catch_all_routes(
        cluster, f"inbound|http|{number}", RouteAction(cluster=cluster, timeout=Duration(seconds=0))
    )
    routes.validate_clusters.CopyFrom(BoolValue(value=False))
    hcm.route_config.CopyFrom(routes)
    return [hcm_filter(hcm)]


def weighted_tcp_proxy(
    targets: tuple[tuple[str, int], ...], source_ip: bool, number: int
) -> Filter:
    if len(targets) == 1 and not source_ip:
        return tcp_proxy(targets[0][0])
    proxy = TcpProxy()
    if len(targets) == 1:
        proxy.stat_prefix = proxy.cluster = targets[0][0]
    else:
        proxy.stat_prefix = f"outbound|{number}|weighted"
        proxy.weighted_clusters.clusters.extend(
            TcpProxy.WeightedCluster.ClusterWeight(name=c, weight=w) for c, w in targets
        )
    if source_ip:
        proxy.hash_policy.append(HashPolicy(source_ip=HashPolicy.SourceIp()))
    return Filter(name=TCP_PROXY_FILTER, typed_config=pack(proxy))
