"""Istio `WorkloadEntry` -> model Workload (a workload declared without an agent)."""

from __future__ import annotations

from dataclasses import dataclass

from control.config import formats
from control.config.fields import Context, Fields
from control.config.kinds.common import ISTIO_NETWORKING_VERSIONS, check_endpoint_address, spec_of
from control.config.objects import ConfigObject
from control.model.types import TLS_MODE_LABEL, Workload, labels_of

API_VERSIONS = ISTIO_NETWORKING_VERSIONS

MAX_WEIGHT = 2**32 - 1


def convert(ctx: Context, domain: str) -> ConfigObject:
    obj = ctx.obj
    spec = spec_of(ctx, formats.dns1123_subdomain)
    address = spec.get_str("address", required=True)
    check_endpoint_address(spec, "address", address, allow_hostname=True)
    labels = spec.get_labels("labels") or {}
    endpoint = endpoint_fields(ctx, spec)
    spec.finish()

    workload = Workload(
        name=obj.name,
        namespace=obj.namespace,
        address=address,
        labels=labels_of(labels),
        service_account=endpoint.service_account,
        source=ctx.source,
        ports=endpoint.ports,
        has_sidecar=labels.get(TLS_MODE_LABEL) == "istio",
        locality=endpoint.locality,
        weight=endpoint.weight,
    )
    return ConfigObject(ctx.source, obj.data, workloads=(workload,))


@dataclass(frozen=True, slots=True)
class EndpointFields:
    """What a WorkloadEntry and a WorkloadGroup's template say alike about a workload."""

    ports: tuple[tuple[str, int], ...]  # sorted by port name
    service_account: str
    locality: str
    weight: int


def endpoint_fields(ctx: Context, f: Fields) -> EndpointFields:
    """`ports`, `serviceAccount`, `network` (warned about), `locality` and `weight` of a
    WorkloadEntry spec or a WorkloadGroup template, checked in that order."""
    ports = f.get_port_map("ports")
    service_account = service_account_of(f)
    network = f.get_str("network")
    if network:
        # The model has one network; pretending otherwise would route across networks wrongly.
        ctx.warn_unsupported(f.at("network"), f"{network!r} (multi-network)")
    locality = locality_of(f)
    weight = f.get_int("weight", maximum=MAX_WEIGHT) or 0
    return EndpointFields(tuple(sorted(ports.items())), service_account, locality, weight)


def service_account_of(f: Fields) -> str:
    value = f.get_str("serviceAccount")
    if value and (problem := formats.dns1123_subdomain(value)):
        f.fail("serviceAccount", problem)
    return value


def locality_of(f: Fields) -> str:
    value = f.get_str("locality")
    if value and (problem := formats.locality(value)):
        f.fail("locality", f"{problem} (got {value!r})")
    return value
