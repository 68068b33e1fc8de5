"""Istio `ServiceEntry` -> one model Service per host (registry "External")."""

from __future__ import annotations

from control.config import formats, protocols
from control.config.fields import Context, Fields
from control.config.kinds.common import (
    ISTIO_NETWORKING_VERSIONS,
    check_endpoint_address,
    istio_protocol,
    selector_labels,
    spec_of,
)
from control.config.kinds.workloadentry import MAX_WEIGHT, locality_of, service_account_of
from control.config.manifest import format_path
from control.config.objects import ConfigObject
from control.model.types import (
    Protocol,
    Resolution,
    Service,
    ServicePort,
    WorkloadEndpointSpec,
    labels_of,
)
from pilotfish_common.addresses import is_ip

API_VERSIONS = ISTIO_NETWORKING_VERSIONS

_LOCATIONS = ("MESH_EXTERNAL", "MESH_INTERNAL")
_RESOLUTIONS = ("NONE", "STATIC", "DNS")


def convert(ctx: Context, domain: str) -> ConfigObject:
    obj = ctx.obj
    spec = spec_of(ctx, formats.dns1123_subdomain)
    hosts = _hosts(spec)
    addresses = _addresses(spec)
    ports = _ports(ctx, spec)
    # Istio's default location is MESH_EXTERNAL (the first enum value).
    location = spec.get_enum("location", _LOCATIONS, default="MESH_EXTERNAL")
    resolution = Resolution(spec.get_enum("resolution", _RESOLUTIONS, default="NONE"))
    endpoints = _endpoints(spec, resolution)
    workload_selector = selector_labels(spec)
    if endpoints and workload_selector is not None:
        spec.fail("workloadSelector", "cannot be used together with endpoints; use one of them")
    if resolution is Resolution.NONE and endpoints:
        spec.fail("endpoints", "must be empty when resolution is NONE (set STATIC or DNS)")
    if resolution is Resolution.DNS and not endpoints and workload_selector is None:
        for i, host in enumerate(hosts):
            if host.startswith("*"):
                spec.ctx.fail(
                    (*spec.at("hosts"), i),
                    f"wildcard host {host!r} needs endpoints when resolution is DNS "
                    "(there is nothing to resolve)",
                )
    export_to = _export_to(spec)
    spec.finish()

    services = tuple(
        Service(
            hostname=host,
            namespace=obj.namespace,
            name=obj.name,
            ports=ports,
            source=ctx.source,
            selector=None,
            addresses=addresses,
            mesh_external=location == "MESH_EXTERNAL",
            resolution=resolution,
            registry="External",
            static_endpoints=endpoints,
            workload_selector=workload_selector,
            export_to=export_to,
        )
        for host in hosts
    )
    return ConfigObject(ctx.source, obj.data, services=services)


def _hosts(spec: Fields) -> list[str]:
    hosts: list[str] = []
    for path, host in spec.get_strs("hosts", required=True):
        if host == "*":
            spec.ctx.fail(path, "'*' is not allowed: a ServiceEntry must name its hosts")
        if problem := formats.wildcard_host(host):
            spec.ctx.fail(path, f"{problem} (got {host!r})")
        if host in hosts:
            spec.ctx.fail(path, f"duplicate host {host!r}")
        hosts.append(host)
    return hosts


def _addresses(spec: Fields) -> tuple[str, ...]:
    out: list[str] = []
    for path, address in spec.get_strs("addresses"):
        if not (is_ip(address) or formats.is_cidr(address)):
            spec.ctx.fail(path, f"must be an IP address or a CIDR range (got {address!r})")
        if address not in out:
            out.append(address)
    return tuple(out)


def _ports(ctx: Context, spec: Fields) -> tuple[ServicePort, ...]:
    out: list[ServicePort] = []
    names: dict[str, str] = {}
    numbers: dict[int, str] = {}
    for item in spec.get_maps("ports"):
        here = format_path(item.path)
        number = item.need_port("number")
        name = item.get_str("name")
        if name in names:
            item.fail("name", f"duplicate port name {name!r} (also in {names[name]})")
        if number in numbers:
            item.fail("number", f"duplicate port {number} (also in {numbers[number]})")
        if name:
            names[name] = here
        numbers[number] = here
        target = item.get_port("targetPort")
        protocol_name = item.get_str("protocol")
        item.finish()
        if protocol_name.lower() == protocols.UDP:
            ctx.warn(f"{here}: protocol UDP is not supported; port {number} ignored")
            continue
        if protocol_name:
            protocol = istio_protocol(item, "protocol", protocol_name)
        else:
            protocol = protocols.from_port_name(name) if name else Protocol.UNKNOWN
        out.append(ServicePort(name=name, port=number, protocol=protocol, target_port=target))
    return tuple(out)


def _endpoints(spec: Fields, resolution: Resolution) -> tuple[WorkloadEndpointSpec, ...]:
    out: list[WorkloadEndpointSpec] = []
    for item in spec.get_maps("endpoints"):
        address = item.get_str("address", required=True)
        # STATIC endpoints are used as they are; DNS endpoints may be names to resolve.
        check_endpoint_address(
            item, "address", address, allow_hostname=resolution is not Resolution.STATIC
        )
        ports = item.get_port_map("ports")
        labels = item.get_labels("labels") or {}
        out.append(
            WorkloadEndpointSpec(
                address=address,
                ports=tuple(sorted(ports.items())),
                labels=labels_of(labels),
                service_account=service_account_of(item),
                network=item.get_str("network"),
                locality=locality_of(item),
                weight=item.get_int("weight", maximum=MAX_WEIGHT) or 0,
            )
        )
        item.finish()
    return tuple(out)


def _export_to(spec: Fields) -> tuple[str, ...]:
    values: list[str] = []
    for path, value in spec.get_strs("exportTo"):
        if value not in ("*", ".", "~") and (problem := formats.dns1123_label(value)):
            spec.ctx.fail(path, f"must be '*', '.', '~' or a namespace name: {problem}")
        if value not in values:
            values.append(value)
    for special in ("*", "~"):
        if special in values and len(values) > 1:
            spec.fail("exportTo", f"{special!r} cannot be combined with other values")
    return tuple(values) or ("*",)
