"""NDS: the DNS name table of one proxy (`istio.networking.nds.v1.NameTable`, one resource).

The agent answers DNS for mesh hostnames from this table. It holds every service the proxy
can see (Sidecar egress scoping, the same `visible_services` that CDS uses):

- Kubernetes services under their FQDN, with registry "Kubernetes", the short name and the
  namespace, from which the agent derives `svc`, `svc.ns` and `svc.ns.svc`;
- ServiceEntry hosts (registry "External") as written, wildcards (`*.example.com`) included.

Addresses depend on the interception mode (DESIGN "Local pods on one machine"): in NONE the
proxy's outbound listeners are bound at its own IP, so every name answers with that IP; in
REDIRECT traffic to the service VIP is captured, so names answer with their VIPs, and a
service without a VIP (headless, or a ServiceEntry without `addresses`) is left to the
upstream resolvers, as Istio does without address auto-allocation.

The table depends on services and Sidecars only (never on endpoints), which is what lets an
endpoint-only push skip it.
"""

from __future__ import annotations

from typing import Final

from control.generate.addresses import is_ip
from control.generate.context import GenContext
from control.model.proxy import Proxy
from control.model.types import Service
from control.xds.cache import Resource, ResourceSet
from protos import nds_pb2
from protos.typeurls import NAME_TABLE

# Istio sends the table as one unnamed resource; so do we (Istio agents interoperate).
RESOURCE_NAME: Final = ""

# (hostname, ips, registry, shortname, namespace): everything one table entry holds.
Entry = tuple[str, tuple[str, ...], str, str, str]


def generate(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    visible = ctx.index.visible_services(proxy)
    redirect = proxy.interception_mode == "REDIRECT"
    # Outbound listeners bind at the proxy's first IP (DESIGN), so that one answers.
    own_ips = () if redirect else (proxy.ip,)
    # The visible tuple is shared by every proxy of one scope (see outbound_plan), and in NONE
    # mode only the proxy's IPs differ between them.
    return ctx.memo(
        ("nds-set", id(visible), own_ips),
        lambda: ResourceSet([_resource(ctx, visible, own_ips)]),
    )


def _resource(ctx: GenContext, visible: tuple[Service, ...], own_ips: tuple[str, ...]) -> Resource:
    entries = name_entries(visible, own_ips)
    return ctx.resource(
        NAME_TABLE, RESOURCE_NAME, entries, lambda: build_name_table(entries), variant=own_ips
    )


def name_entries(services: tuple[Service, ...], own_ips: tuple[str, ...]) -> tuple[Entry, ...]:
    """The table's rows: `own_ips` answers every name (NONE mode); empty means VIPs."""
    out: list[Entry] = []
    for s in services:
        # A ServiceEntry address may be a CIDR range: something to match traffic against,
        # never an answer (the agent would rightly reject the whole table for it).
        ips = own_ips or tuple(a for a in s.addresses if is_ip(a))
        if not ips:
            continue
        kube = s.registry == "Kubernetes"
        out.append(
            (
                s.hostname,
                tuple(ips),
                s.registry,
                s.name if kube else "",
                s.namespace if kube else "",
            )
        )
    return tuple(out)


def search_names(service: Service, client_namespace: str) -> list[str]:
    """Hosts a client in `client_namespace` may use for `service`, FQDN first: for a
    Kubernetes service also the DNS search-path forms `name.ns.svc`, `name.ns` and (in its
    own namespace only) `name`, as the agent answers them from this table."""
    names = [service.hostname]
    if service.registry == "Kubernetes":
        svc = f"{service.name}.{service.namespace}.svc"
        if service.hostname.startswith(svc + "."):
            names += [svc, f"{service.name}.{service.namespace}"]
            if service.namespace == client_namespace:
                names.append(service.name)
    return names


def build_name_table(entries: tuple[Entry, ...]) -> nds_pb2.NameTable:
    table = nds_pb2.NameTable()
    for hostname, ips, registry, shortname, namespace in entries:
        info = table.table[hostname]
        info.ips.extend(ips)
        info.registry = registry
        if shortname:
            info.shortname = shortname
            info.namespace = namespace
    return table
