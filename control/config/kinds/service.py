"""Kubernetes `v1 Service` -> model Service (`<name>.<namespace>.svc.<domain>`)."""

from __future__ import annotations

from typing import Any

from control.config import formats, protocols
from control.config.fields import PORT_RANGE, Context, Fields
from control.config.kinds.common import spec_of
from control.config.objects import ConfigObject
from control.model.types import Resolution, Service, ServicePort, labels_of
from pilotfish_common.addresses import is_ip

API_VERSIONS = ("v1",)

_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")
_PORT_PROTOCOLS = ("TCP", "UDP", "SCTP")

# Fields whose stated value means "the default behaviour": accepted silently at that value,
# reported as unsupported at any other value.
_DEFAULT_ONLY: dict[str, Any] = {
    "sessionAffinity": "None",
    "internalTrafficPolicy": "Cluster",
    "externalTrafficPolicy": "Cluster",
    "publishNotReadyAddresses": False,
}
# Fields that only steer cluster IP allocation, which has no meaning for config from files.
_NO_EFFECT = ("ipFamilies", "ipFamilyPolicy")


def convert(ctx: Context, domain: str) -> ConfigObject:
    obj = ctx.obj
    spec = spec_of(ctx, formats.dns1035_label)

    service_type = spec.get_enum("type", _TYPES, default="ClusterIP")
    if service_type != "ClusterIP":
        ctx.warn(f"spec.type {service_type} is not supported; treated as ClusterIP")
    selector = spec.get_labels("selector")
    addresses, headless = _addresses(spec)
    ports = _ports(ctx, spec, required=not headless and service_type != "ExternalName")
    for key, default in _DEFAULT_ONLY.items():
        value = spec.raw(key)
        if value is not None and value != default:
            ctx.warn_unsupported(spec.at(key), str(value))
    spec.ignore(*_NO_EFFECT)
    spec.finish()

    service = Service(
        hostname=f"{obj.name}.{obj.namespace}.svc.{domain}",
        namespace=obj.namespace,
        name=obj.name,
        ports=ports,
        source=ctx.source,
        selector=labels_of(selector) if selector is not None else None,
        addresses=addresses,
        # A headless service has no VIP: clients connect to the endpoints they resolve.
        resolution=Resolution.NONE if headless else Resolution.STATIC,
        registry="Kubernetes",
    )
    return ConfigObject(ctx.source, obj.data, services=(service,))


def _addresses(spec: Fields) -> tuple[tuple[str, ...], bool]:
    """(cluster IPs, headless) from `clusterIP` and `clusterIPs`."""
    out: list[str] = []
    cluster_ip = spec.get_str("clusterIP")
    headless = cluster_ip == "None"
    if cluster_ip and not headless:
        if not is_ip(cluster_ip):
            spec.fail("clusterIP", f'must be an IP address or "None" (got {cluster_ip!r})')
        out.append(cluster_ip)
    for path, ip in spec.get_strs("clusterIPs"):
        if ip == "None":
            headless = True
            continue
        if not is_ip(ip):
            spec.ctx.fail(path, f'must be an IP address or "None" (got {ip!r})')
        if ip not in out:
            out.append(ip)
    if headless and out:
        spec.fail(
            "clusterIP", 'a headless service (clusterIP: "None") cannot also have cluster IPs'
        )
    return tuple(out), headless


def _ports(ctx: Context, spec: Fields, *, required: bool) -> tuple[ServicePort, ...]:
    items = spec.get_maps("ports")
    if not items and required:
        spec.fail("ports", "is required: a Service needs at least one port")
    names: dict[str, str] = {}
    numbers: dict[tuple[int, str], str] = {}
    out: list[ServicePort] = []
    for item in items:
        here = f"spec.ports[{item.path[-1]}]"
        name = item.get_str("name")
        if name:
            if problem := formats.dns1123_label(name):
                item.fail("name", problem)
            if name in names:
                item.fail("name", f"duplicate port name {name!r} (also in {names[name]})")
            names[name] = here
        elif len(items) > 1:
            item.fail("name", "is required when a Service has more than one port")
        number = item.need_port("port")
        kube_protocol = item.get_enum("protocol", _PORT_PROTOCOLS, default="TCP")
        if (number, kube_protocol) in numbers:
            other = numbers[number, kube_protocol]
            item.fail("port", f"duplicate {kube_protocol} port {number} (also in {other})")
        numbers[number, kube_protocol] = here
        target = _target_port(item)
        app_protocol = item.get_str("appProtocol")
        item.finish()
        if kube_protocol != "TCP":
            ctx.warn(f"{here}: protocol {kube_protocol} is not supported; port {number} ignored")
            continue
        protocol = protocols.detect_service_port(name, app_protocol)
        out.append(ServicePort(name=name, port=number, protocol=protocol, target_port=target))
    return tuple(out)


def _target_port(item: Fields) -> int | str | None:
    """`targetPort`: a number, a named container port, or absent (= the service port)."""
    value = item.raw("targetPort")
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        item.fail("targetPort", f"{PORT_RANGE} or a port name")
    if isinstance(value, int):
        if not 1 <= value <= 65535:
            item.fail("targetPort", f"{PORT_RANGE} or a port name")
        return value
    if not isinstance(value, str) or formats.port_name(value) is not None:
        item.fail("targetPort", f"{PORT_RANGE} or a port name (got {value!r})")
    return value
