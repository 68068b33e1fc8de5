"""Istio `Sidecar` -> model SidecarScope (listeners and egress visibility of a workload)."""

from __future__ import annotations

from control.config import formats
from control.config.fields import Context, Fields
from control.config.kinds.common import (
    ISTIO_NETWORKING_VERSIONS,
    istio_protocol,
    selector_labels,
    spec_of,
)
from control.config.manifest import format_path
from control.config.objects import ConfigObject
from control.model.types import (
    CaptureMode,
    EgressListener,
    IngressListener,
    SidecarPort,
    SidecarScope,
)
from pilotfish_common.addresses import is_ip

API_VERSIONS = ISTIO_NETWORKING_VERSIONS

_CAPTURE_MODES = tuple(m.value for m in CaptureMode)
_OUTBOUND_MODES = ("ALLOW_ANY", "REGISTRY_ONLY")
_LOOPBACK_ENDPOINT_HOSTS = ("127.0.0.1", "0.0.0.0", "[::1]", "[::]")
_HOST_FORM = 'must be "namespace/dnsName", e.g. "./*", "istio-system/*" or "*/api.example.com"'


def convert(ctx: Context, domain: str) -> ConfigObject:
    obj = ctx.obj
    spec = spec_of(ctx, formats.dns1123_subdomain)
    selector = selector_labels(spec)
    if selector == ():
        spec.ctx.fail(
            (*spec.at("workloadSelector"), "labels"),
            "must have at least one label (omit workloadSelector to apply to the whole namespace)",
        )
    ingress = _ingress(spec)
    egress = _egress(spec)
    policy = ""  # not set: the mesh-wide policy (--outbound-traffic-policy) applies
    outbound = spec.get_map("outboundTrafficPolicy")
    if outbound is not None:
        policy = outbound.get_enum("mode", _OUTBOUND_MODES, default="ALLOW_ANY")
        outbound.finish()
    spec.finish()

    scope = SidecarScope(
        namespace=obj.namespace,
        name=obj.name,
        source=ctx.source,
        workload_selector=selector,
        ingress=ingress,
        egress=egress,
        outbound_traffic_policy=policy,
    )
    return ConfigObject(ctx.source, obj.data, sidecars=(scope,))


def _ingress(spec: Fields) -> tuple[IngressListener, ...]:
    out: list[IngressListener] = []
    seen: dict[tuple[str, int], str] = {}
    for item in spec.get_maps("ingress"):
        port = _port(item, required=True)
        if port is None:  # _port raised already; this narrows the type
            item.fail("port", "is required")
        bind = _bind(item)
        key = (bind, port.number)
        if key in seen:
            item.fail("port", f"duplicate ingress port {port.number} (also in {seen[key]})")
        seen[key] = format_path(item.path)
        out.append(
            IngressListener(
                port=port,
                bind=bind,
                default_endpoint=_default_endpoint(item),
                capture_mode=_capture_mode(item),
            )
        )
        item.finish()
    return tuple(out)


def _egress(spec: Fields) -> tuple[EgressListener, ...]:
    out: list[EgressListener] = []
    items = spec.get_maps("egress")
    seen: dict[tuple[str, int], str] = {}
    for position, item in enumerate(items):
        hosts = tuple(
            _egress_host(item, path, host) for path, host in item.get_strs("hosts", required=True)
        )
        port = _port(item, required=False)
        bind = _bind(item)
        capture_mode = _capture_mode(item)
        if port is None:
            if bind:
                item.fail("bind", "requires a port (a listener without a port has no address)")
            if position != len(items) - 1:
                item.fail(
                    None,
                    "an egress listener without a port catches all other ports; "
                    "it must be the last one",
                )
        else:
            key = (bind, port.number)
            if key in seen:
                item.fail("port", f"duplicate egress port {port.number} (also in {seen[key]})")
            seen[key] = format_path(item.path)
        item.finish()
        out.append(EgressListener(hosts=hosts, port=port, bind=bind, capture_mode=capture_mode))
    return tuple(out)


def _egress_host(item: Fields, path: tuple[str | int, ...], host: str) -> str:
    namespace, slash, dns_name = host.partition("/")
    if not slash or not namespace or not dns_name:
        item.ctx.fail(path, f"{_HOST_FORM} (got {host!r})")
    if namespace not in ("*", ".", "~") and formats.dns1123_label(namespace):
        item.ctx.fail(path, f"namespace {namespace!r} must be '*', '.', '~' or a namespace name")
    if dns_name != "*" and (problem := formats.wildcard_host(dns_name)):
        item.ctx.fail(path, f"host {dns_name!r} {problem}, or '*'")
    return host


def _port(item: Fields, *, required: bool) -> SidecarPort | None:
    f = item.get_map("port", required=required)
    if f is None:
        return None
    number = f.need_port("number")
    name = f.get_str("name")
    if name and (problem := formats.dns1123_label(name)):
        f.fail("name", problem)
    protocol_name = f.get_str("protocol", required=True)
    protocol = istio_protocol(f, "protocol", protocol_name, "unknown or unsupported")
    f.finish()
    return SidecarPort(number=number, protocol=protocol, name=name)


def _bind(item: Fields) -> str:
    bind = item.get_str("bind")
    if bind and not is_ip(bind):
        item.fail("bind", f"must be an IP address (got {bind!r})")
    return bind


def _capture_mode(item: Fields) -> CaptureMode:
    return CaptureMode(item.get_enum("captureMode", _CAPTURE_MODES, default="DEFAULT"))


def _default_endpoint(item: Fields) -> str:
    """Where inbound traffic goes: `127.0.0.1:PORT`, `0.0.0.0:PORT` (the app at the pod IP),
    their IPv6 forms, or a Unix socket `unix:///path`."""
    value = item.get_str("defaultEndpoint", required=True)
    if value.startswith("unix://"):
        if value.startswith(("unix:///", "unix://@")) and len(value) > len("unix:///"):
            return value
    else:
        host, _, port = value.rpartition(":")
        if host in _LOOPBACK_ENDPOINT_HOSTS and port.isdigit() and 1 <= int(port) <= 65535:
            return value
    item.fail(
        "defaultEndpoint",
        f"must be 127.0.0.1:PORT, 0.0.0.0:PORT, [::1]:PORT, [::]:PORT or unix:///path "
        f"(got {value!r})",
    )
