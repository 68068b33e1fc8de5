"""RDS: one RouteConfiguration per outbound HTTP port, named after the port (`"9080"`), as
Istio does. HTTP services sharing a port share its listener and are told apart by the
Host/authority header, so each gets a virtual host `HOST:PORT` whose domains are every name a
client in the proxy's namespace may use for it.
"""

from __future__ import annotations

from envoy.config.route.v3.route_components_pb2 import (
    Route,
    RouteAction,
    RouteMatch,
    VirtualHost,
)
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from google.protobuf.duration_pb2 import Duration
from google.protobuf.wrappers_pb2 import BoolValue

from control.generate import virtual
from control.generate.common import (
    ROUTE_TYPE,
    OutboundPort,
    outbound_plan,
    variant_resource,
    warn_once,
)
from control.generate.context import GenContext
from control.model.proxy import Proxy
from control.model.types import Service
from control.xds.cache import Resource, ResourceSet

# (virtual host name, cluster, domains): everything a virtual host's bytes are made of.
VhostSpec = tuple[str, str, tuple[str, ...]]


def generate(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    plan = outbound_plan(ctx, proxy)
    # REDIRECT: hosts outside the registry go where the outbound traffic policy says.
    fallback = virtual.route_fallback(ctx, proxy)
    # Short names depend on the client's namespace, so the scope alone is not enough.
    return ctx.memo(
        ("rds-set", proxy.namespace, id(plan.visible), fallback),
        lambda: ResourceSet(
            [_resource(ctx, port, proxy.namespace, fallback) for port in plan.ports if port.http]
        ),
    )


def _resource(
    ctx: GenContext, port: OutboundPort, client_namespace: str, fallback: str = ""
) -> Resource:
    key = (port.number, vhost_specs(port, client_namespace), fallback)
    # The same name ("9080") carries different domains for clients in different namespaces;
    # the key holds the finished domains, so namespaces that end up with the same names (the
    # usual case: no service of theirs on the port) share the bytes.
    return variant_resource(ctx, ROUTE_TYPE, str(port.number), key, lambda: build(*key))


def vhost_specs(port: OutboundPort, client_namespace: str) -> tuple[VhostSpec, ...]:
    """Virtual hosts in hostname order; a domain two services could claim goes to the first
    (Envoy rejects a RouteConfiguration with a duplicate domain, case-insensitively)."""
    claimed: dict[str, str] = {}
    specs: list[VhostSpec] = []
    for cluster in sorted(port.http, key=lambda c: c.service.hostname):
        service = cluster.service
        domains: list[str] = []
        own: set[str] = set()
        for domain in domains_for(service, port.number, client_namespace):
            folded = domain.lower()
            owner = claimed.setdefault(folded, service.hostname)
            if owner == service.hostname:
                # A VIP can repeat a name already listed; say each domain once.
                if folded not in own:
                    own.add(folded)
                    domains.append(domain)
                continue
            warn_once(
                ("domain-conflict", port.number, domain, service.hostname, owner),
                "port %d: domain %s of %s is already used by %s; left out",
                port.number,
                domain,
                service.hostname,
                owner,
            )
        if domains:
            specs.append((f"{service.hostname}:{port.number}", cluster.name, tuple(domains)))
    return tuple(specs)


def domains_for(service: Service, port: int, client_namespace: str) -> list[str]:
    """Every Host a client may send for `service`: its FQDN; for a Kubernetes service also the
    search-path forms `name.ns.svc`, `name.ns` and (same namespace only) `name`; the VIPs; each
    bare and with `:port`."""
    names = [service.hostname]
    if service.registry == "Kubernetes":
        svc = f"{service.name}.{service.namespace}.svc"
        if service.hostname.startswith(svc + "."):
            names += [svc, f"{service.name}.{service.namespace}"]
            if service.namespace == client_namespace:
                names.append(service.name)
    # A ServiceEntry address may be a CIDR, which is no Host value.
    names += [a for a in service.addresses if "/" not in a]
    out: list[str] = []
    for name in names:
        host = f"[{name}]" if ":" in name else name
        out += [host, f"{host}:{port}"]
    return out


def build(port: int, vhosts: tuple[VhostSpec, ...], fallback: str = "") -> RouteConfiguration:
    config = RouteConfiguration(
        name=str(port),
        virtual_hosts=[
            VirtualHost(
                name=name,
                domains=list(domains),
                routes=[
                    Route(
                        name="default",
                        match=RouteMatch(prefix="/"),
                        # 0s disables Envoy's 15s default route timeout, as Istio does:
                        # streaming and long-poll calls must not be cut by the mesh.
                        route=RouteAction(cluster=cluster, timeout=Duration(seconds=0)),
                    )
                ],
            )
            for name, cluster, domains in vhosts
        ],
        # Clusters and routes travel on one ADS stream in separate responses; validating
        # references would reject a route that merely arrived before its cluster.
        validate_clusters=BoolValue(value=False),
    )
    config.virtual_hosts.extend(virtual.fallback_vhosts(fallback))
    return config
