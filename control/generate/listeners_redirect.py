"""LDS for interception mode REDIRECT: iptables (`pilotfish-agent iptables`) sends every
outbound TCP connection of the pod to port 15001 and every inbound one to 15006, so Envoy
needs two listeners there, named as Istio names them, that pick a filter chain by the
connection's original destination (restored by the original_dst listener filter):

- `virtualOutbound` (0.0.0.0:15001): per outbound port of the visible services the same thing
  mode NONE binds at `<pod IP>:<port>`: HTTP ports → an HttpConnectionManager on RDS `"<port>"`
  (matched on the port, any address: a client may dial a VIP or an endpoint); TLS services by
  SNI; plain TCP services by their VIPs (`Service.spec.clusterIP`, ServiceEntry `addresses`),
  or by port alone when they have none. Anything else is an unknown destination: passed to
  its original address (`PassthroughCluster`) under outboundTrafficPolicy ALLOW_ANY, refused
  (`BlackHoleCluster`) under REGISTRY_ONLY. HTTP to an unknown host on a mesh HTTP port gets
  the same choice from a catch-all virtual host in that port's routes (`fallback_vhosts`).
- `virtualInbound` (0.0.0.0:15006): per inbound port (services selecting the workload, or
  its Sidecar ingress) the chains mode NONE builds (mTLS per PeerAuthentication, RBAC), matched
  on the destination port; then passthrough chains to the original destination for every
  other port, under the workload's default mTLS mode, so STRICT covers undeclared ports too.

The listeners' builders are pure functions of hashable specs, cached like every resource.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from envoy.config.core.v3.address_pb2 import CidrRange
from envoy.config.core.v3.base_pb2 import TrafficDirection
from envoy.config.listener.v3.listener_components_pb2 import (
    Filter,
    FilterChain,
    FilterChainMatch,
    ListenerFilter,
)
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.route.v3.route_components_pb2 import (
    DirectResponseAction,
    Route,
    RouteAction,
    RouteMatch,
    VirtualHost,
)
from envoy.extensions.filters.listener.original_dst.v3.original_dst_pb2 import OriginalDst
from envoy.extensions.filters.listener.tls_inspector.v3.tls_inspector_pb2 import TlsInspector
from google.protobuf.duration_pb2 import Duration
from google.protobuf.wrappers_pb2 import UInt32Value

from control.generate import listeners_explicit
from control.generate.addresses import WILDCARD_BIND, WILDCARD_BIND_IPV6, is_ip, socket_address
from control.generate.authz_rbac import network_filters as network_rbac_filters
from control.generate.conflicts import Conflict, Conflicts
from control.generate.context import GenContext
from control.generate.filters import (
    TLS_INSPECTOR_FILTER,
    hcm_filter,
    sidecar_hcm,
    tcp_proxy,
)
from control.generate.listener_telemetry import listener_telemetry, with_telemetry
from control.generate.mesh_tls import MESH_ALPN_MATCH, downstream_socket
from control.generate.plans import OutboundPort, inbound_ports, outbound_plan
from control.generate.resource_names import BLACKHOLE_CLUSTER, LISTENER_TYPE, PASSTHROUGH_CLUSTER
from control.generate.route_translation import add_route_filters
from control.generate.telemetry_metrics import instrument_listener, workload_telemetry
from control.generate.warn import warn_once
from control.generate.wire import ads_config_source, pack
from control.model.index import MeshIndex
from control.model.proxy import Proxy
from control.model.telemetry import WorkloadMode
from control.model.types import AuthorizationPolicy, MtlsMode
from control.xds.cache import Resource, ResourceSet

VIRTUAL_OUTBOUND: Final = "virtualOutbound"
VIRTUAL_INBOUND: Final = "virtualInbound"
OUTBOUND_CAPTURE_PORT: Final = 15001
INBOUND_CAPTURE_PORT: Final = 15006
ORIGINAL_DST_FILTER: Final = "envoy.filters.listener.original_dst"
ALLOW_ANY: Final = "ALLOW_ANY"
REGISTRY_ONLY: Final = "REGISTRY_ONLY"

# One outbound filter chain: (kind "http"|"tcp", port, VIP prefixes, SNI names, cluster).
# An http chain's cluster is unused (the routes choose); the RDS name is the port.
OutboundChain = tuple[str, int, tuple[str, ...], tuple[str, ...], listeners_explicit.TcpTargets]
# One inbound port: (port, HTTP?, mTLS mode).
InboundSpec = tuple[int, bool, MtlsMode]


def is_redirect(proxy: Proxy) -> bool:
    return proxy.interception_mode == "REDIRECT"


def generate_listeners(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    """LDS for an Envoy sidecar in either interception mode."""
    if not is_redirect(proxy):
        return listeners_explicit.generate(ctx, proxy)
    return ResourceSet([_outbound(ctx, proxy), _inbound(ctx, proxy)])


def route_fallback(ctx: GenContext, proxy: Proxy) -> str:
    """The outbound traffic policy that the routes of a REDIRECT proxy fall back to for hosts
    outside the registry; "" (no fallback: Envoy's 404) in mode NONE, where only the app's
    own calls to a mesh port ever reach the listener."""
    return ctx.index.outbound_policy(proxy) if is_redirect(proxy) else ""


def fallback_vhosts(policy: str) -> list[VirtualHost]:
    """Istio's catch-all virtual hosts: `allow_any` passes the request on to the address the
    client dialled; `block_all` answers 502."""
    if policy == ALLOW_ANY:
        action = Route(
            name="allow_any",
            match=RouteMatch(prefix="/"),
            route=RouteAction(cluster=PASSTHROUGH_CLUSTER, timeout=Duration(seconds=0)),
        )
        return [VirtualHost(name="allow_any", domains=["*"], routes=[action])]
    if policy == REGISTRY_ONLY:
        block = Route(
            name="block_all",
            match=RouteMatch(prefix="/"),
            direct_response=DirectResponseAction(status=502),
        )
        return [VirtualHost(name="block_all", domains=["*"], routes=[block])]
    return []


# --- virtualOutbound -------------------------------------------------------------------------


def _outbound(ctx: GenContext, proxy: Proxy) -> Resource:
    plan = outbound_plan(ctx, proxy)
    chains = ctx.memo(
        ("virtual-chains", plan.key),
        lambda: outbound_chains(plan.ports, ctx.conflicts, ctx.index, plan.scope),
    )
    key = (chains, ctx.index.outbound_policy(proxy), has_ipv6(proxy))
    return _instrumented(
        ctx, proxy, VIRTUAL_OUTBOUND, WorkloadMode.CLIENT, key, lambda: build_virtual_outbound(*key)
    )


def _instrumented(
    ctx: GenContext,
    proxy: Proxy,
    name: str,
    side: WorkloadMode,
    key: tuple[object, ...],
    build: Callable[[], Listener],
) -> Resource:
    """A virtual listener with the proxy's telemetry for its side (access logs, tracing,
    standard metrics), cached under its inputs and that telemetry."""
    tel = listener_telemetry(ctx, proxy, side)
    telemetry = workload_telemetry(ctx, proxy)
    return ctx.resource(
        LISTENER_TYPE,
        name,
        (*key, tel, telemetry),
        lambda: instrument_listener(with_telemetry(build(), tel), telemetry),
        variant=(*key, tel, telemetry),
    )


def has_ipv6(proxy: Proxy) -> bool:
    """A dual-stack (or IPv6) pod: ip6tables redirects its IPv6 traffic to `[::]:15001` and
    `[::]:15006`, so the virtual listeners listen there too (one listener, two addresses:
    its name, stats and filter chains stay those of the IPv4 listener)."""
    return any(":" in ip for ip in proxy.ips)


def _dual_stack(listener: Listener, port: int) -> None:
    extra = listener.additional_addresses.add()
    extra.address.CopyFrom(socket_address(WILDCARD_BIND_IPV6, port))


def _vip_prefixes(addresses: tuple[str, ...]) -> tuple[str, ...]:
    out = []
    for a in addresses:
        if "/" in a:
            out.append(a)
        elif is_ip(a):
            out.append(f"{a}/{128 if ':' in a else 32}")
    return tuple(sorted(set(out)))


def outbound_chains(
    ports: tuple[OutboundPort, ...],
    conflicts: Conflicts | None = None,
    index: MeshIndex | None = None,
    scope: str = "",
) -> tuple[OutboundChain, ...]:
    """The filter chains of virtualOutbound, each match unique (Envoy rejects duplicates);
    TLS and TCP chains follow VirtualService `tls` and `tcp` routes as in mode NONE."""
    chains: list[OutboundChain] = []
    for port in ports:
        port_taken = False
        if port.http:
            chains.append(("http", port.number, (), (), ((), False)))
            port_taken = True
        for server_names, targets in listeners_explicit.tls_chains(port, index, scope):
            chains.append(("tcp", port.number, (), server_names, targets))
        claimed: dict[str, str] = {}
        for c in sorted(port.tcp, key=lambda c: c.service.hostname):
            prefixes = tuple(p for p in _vip_prefixes(c.service.addresses) if p not in claimed)
            targets = listeners_explicit.tcp_targets(c, port.number, index, scope)
            if prefixes:
                for p in prefixes:
                    claimed[p] = c.service.hostname
                chains.append(("tcp", port.number, prefixes, (), targets))
            elif not port_taken:
                # No address to tell it by: it takes the whole port, as in mode NONE.
                chains.append(("tcp", port.number, (), (), targets))
                port_taken = True
            else:
                if conflicts is not None:
                    kind = Conflict.TCP_OVER_HTTP if port.http else Conflict.TCP_OVER_TCP
                    conflicts.add(kind, (port.number, c.service.hostname))
                warn_once(
                    ("virtual-tcp-unreachable", port.number, c.service.hostname),
                    "port %d: TCP service %s has no VIP and another service takes the port; "
                    "it is not reachable through capture",
                    port.number,
                    c.service.hostname,
                )
    return tuple(chains)


def _original_dst() -> ListenerFilter:
    return ListenerFilter(name=ORIGINAL_DST_FILTER, typed_config=pack(OriginalDst()))


def _tls_inspector() -> ListenerFilter:
    return ListenerFilter(name=TLS_INSPECTOR_FILTER, typed_config=pack(TlsInspector()))


def _capture_listener(
    name: str, port: int, direction: TrafficDirection.ValueType, ipv6: bool
) -> Listener:
    """The listener the capture rules send one direction's traffic to. The original
    destination is restored by the listener filter and chains match on it; no hand-off to
    other listeners (there are none in this mode)."""
    listener = Listener(
        name=name,
        address=socket_address(WILDCARD_BIND, port),
        traffic_direction=direction,
        listener_filters=[_original_dst()],
    )
    if ipv6:
        _dual_stack(listener, port)
    return listener


def build_virtual_outbound(
    chains: tuple[OutboundChain, ...], policy: str, ipv6: bool = False
) -> Listener:
    listener = _capture_listener(
        VIRTUAL_OUTBOUND, OUTBOUND_CAPTURE_PORT, TrafficDirection.OUTBOUND, ipv6
    )
    for kind, number, prefixes, server_names, (targets, source_ip) in chains:
        match = FilterChainMatch(destination_port=UInt32Value(value=number))
        match.prefix_ranges.extend(_cidr(p) for p in prefixes)
        if server_names:
            match.server_names.extend(server_names)
            match.transport_protocol = "tls"
        if kind == "http":
            hcm = sidecar_hcm(f"outbound_{WILDCARD_BIND}_{number}")
            add_route_filters(hcm)
            hcm.rds.config_source.CopyFrom(ads_config_source())
            hcm.rds.route_config_name = str(number)
            filters = [hcm_filter(hcm)]
            name = f"{WILDCARD_BIND}_{number}"
        else:
            proxy = listeners_explicit.weighted_tcp_proxy(targets, source_ip, number)
            filters = [proxy]
            target = targets[0][0] if len(targets) == 1 else f"outbound|{number}|weighted"
            name = f"{target}|{','.join(prefixes)}"
        listener.filter_chains.append(
            FilterChain(name=name, filter_chain_match=match, filters=filters)
        )
    if any(server_names for _, _, _, server_names, _ in chains):
        listener.listener_filters.append(_tls_inspector())
    unknown = PASSTHROUGH_CLUSTER if policy == ALLOW_ANY else BLACKHOLE_CLUSTER
    listener.default_filter_chain.CopyFrom(FilterChain(name=unknown, filters=[tcp_proxy(unknown)]))
    return listener


def _cidr(prefix: str) -> CidrRange:
    address, _, length = prefix.partition("/")
    return CidrRange(address_prefix=address, prefix_len=UInt32Value(value=int(length)))


# --- virtualInbound --------------------------------------------------------------------------


def _inbound(ctx: GenContext, proxy: Proxy) -> Resource:
    peer = ctx.index.peer_policy(proxy.namespace, proxy.labels)
    policies = ctx.index.authorization_policies(proxy.namespace, proxy.labels)
    specs: list[InboundSpec] = []
    for port in inbound_ports(ctx, proxy):
        mode = _usable_mode(proxy, peer.mode_for(port.number), port.number)
        if mode is not None:
            specs.append((port.number, port.protocol.is_http, mode))
    default = _usable_mode(proxy, peer.mode, 0)
    key = (tuple(specs), default, policies, has_ipv6(proxy))
    return _instrumented(
        ctx, proxy, VIRTUAL_INBOUND, WorkloadMode.SERVER, key, lambda: build_virtual_inbound(*key)
    )


def _usable_mode(proxy: Proxy, mode: MtlsMode, port: int) -> MtlsMode | None:
    """As in mode NONE: a proxy without certificates cannot terminate mTLS, so STRICT means
    the port is not served (None) and anything else is plaintext."""
    if proxy.sds:
        return mode
    if mode is MtlsMode.STRICT:
        warn_once(
            ("strict-without-sds-virtual", proxy.id, port),
            "proxy %s: %s is STRICT mTLS but the proxy has no SDS; not served",
            proxy.id,
            f"inbound port {port}" if port else "inbound passthrough",
        )
        return None
    return MtlsMode.DISABLE


def build_virtual_inbound(
    ports: tuple[InboundSpec, ...],
    default: MtlsMode | None,
    policies: tuple[AuthorizationPolicy, ...] = (),
    ipv6: bool = False,
) -> Listener:
    listener = _capture_listener(
        VIRTUAL_INBOUND, INBOUND_CAPTURE_PORT, TrafficDirection.INBOUND, ipv6
    )
    inspect = False
    for number, http, mode in ports:
        # Mode NONE's chains for this port, told apart from other ports by the destination.
        per_port = listeners_explicit.build_inbound(WILDCARD_BIND, number, http, mode, policies)
        inspect |= bool(per_port.listener_filters)
        for chain in per_port.filter_chains:
            chain.name = f"{number}_{chain.name}"
            chain.filter_chain_match.destination_port.value = number
            listener.filter_chains.append(chain)
    if default is not None:
        listener.filter_chains.extend(_passthrough_chains(default, policies))
        inspect |= default is MtlsMode.PERMISSIVE
    if inspect:
        listener.listener_filters.append(_tls_inspector())
    return listener


def _passthrough_chains(
    mode: MtlsMode, policies: tuple[AuthorizationPolicy, ...]
) -> list[FilterChain]:
    """Ports no service declares: TCP to the original destination (the app), behind the
    same mTLS and RBAC as declared ports."""
    rbac = [
        Filter(name=n, typed_config=pack(cfg))
        for n, cfg in network_rbac_filters(policies, "inbound_passthrough")
    ]
    filters = [*rbac, tcp_proxy(PASSTHROUGH_CLUSTER)]
    out: list[FilterChain] = []
    if mode in (MtlsMode.STRICT, MtlsMode.PERMISSIVE):
        chain = FilterChain(
            name="passthrough_mtls", filters=filters, transport_socket=downstream_socket()
        )
        if mode is MtlsMode.PERMISSIVE:
            chain.filter_chain_match.CopyFrom(
                FilterChainMatch(
                    transport_protocol="tls", application_protocols=list(MESH_ALPN_MATCH)
                )
            )
        out.append(chain)
    if mode in (MtlsMode.DISABLE, MtlsMode.PERMISSIVE):
        out.append(FilterChain(name="passthrough_plaintext", filters=list(filters)))
    return out
