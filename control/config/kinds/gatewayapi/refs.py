"""Pieces the Gateway API kinds share: API versions, the envelope, parentRefs, backendRefs,
hostnames, and header modifier filters."""

from __future__ import annotations

import dataclasses

from control.config import formats
from control.config.fields import Context, Fields
from control.config.kinds.common import spec_of
from control.model.gatewayapi import (
    GROUP,
    BackendRef,
    ObjectRef,
    ParentRef,
)
from control.model.traffic import NO_HEADERS, HeaderOps

V1 = (f"{GROUP}/v1", f"{GROUP}/v1beta1")
ALPHA = (f"{GROUP}/v1alpha2", f"{GROUP}/v1alpha3")
# ReferenceGrant and GRPCRoute were beta/alpha for long; accept every version still served.
# The first version of each is the one the Kubernetes source watches.
REFERENCE_GRANT_VERSIONS = (f"{GROUP}/v1beta1", f"{GROUP}/v1", f"{GROUP}/v1alpha2")
GRPC_ROUTE_VERSIONS = (f"{GROUP}/v1", f"{GROUP}/v1alpha2")


def gateway_spec(ctx: Context) -> Fields:
    return spec_of(ctx, formats.dns1123_subdomain)


def generation(ctx: Context) -> int:
    meta = ctx.obj.data.get("metadata") or {}
    value = meta.get("generation")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def created(ctx: Context) -> str:
    meta = ctx.obj.data.get("metadata") or {}
    value = meta.get("creationTimestamp")
    return value if isinstance(value, str) else ""


def check_hostname(f: Fields, path: tuple[str | int, ...], value: str) -> None:
    """A Gateway API hostname: a DNS name, optionally with a leading `*.`; never an IP."""
    if problem := formats.wildcard_host(value):
        f.ctx.fail(path, f"{problem} (got {value!r})")


def hostnames(spec: Fields, key: str = "hostnames") -> tuple[str, ...]:
    out: list[str] = []
    for path, value in spec.get_strs(key):
        check_hostname(spec, path, value)
        if value.lower() not in out:
            out.append(value.lower())
    return tuple(out)


def parent_refs(spec: Fields) -> tuple[ParentRef, ...]:
    out: list[ParentRef] = []
    for f in spec.get_maps("parentRefs"):
        written = {k: v for k, v in f.data.items() if isinstance(v, str | int)}
        ref = ParentRef(
            group=f.get_str("group", default=GROUP),
            kind=f.get_str("kind", default="Gateway"),
            namespace=f.get_str("namespace", default=spec.ctx.obj.namespace),
            name=f.get_str("name", required=True),
            section_name=f.get_str("sectionName"),
            port=f.get_port("port"),
            written=tuple(sorted(written.items())),
        )
        f.finish()
        out.append(ref)
    return tuple(out)


def object_ref(
    f: Fields, *, default_group: str, default_kind: str, namespaced: bool = True
) -> ObjectRef:
    """`{group, kind, name, namespace}`; the namespace defaults to the referrer's."""
    return ObjectRef(
        group=f.get_str("group", default=default_group),
        kind=f.get_str("kind", default=default_kind),
        namespace=f.get_str("namespace", default=f.ctx.obj.namespace) if namespaced else "",
        name=f.get_str("name", required=True),
    )


def backend_ref(f: Fields, *, with_filters: bool = True) -> BackendRef:
    """One `backendRefs[]` entry (also a RequestMirror's `backendRef`)."""
    ref = object_ref(f, default_group="", default_kind="Service")
    port = f.get_port("port")
    if ref.group == "" and ref.kind == "Service" and port is None:
        f.fail("port", "is required for a Service backend")
    weight = 1
    if with_filters:
        value = f.get_int("weight", maximum=1_000_000)
        weight = 1 if value is None else value
    headers = NO_HEADERS
    if with_filters:
        for item in f.get_maps("filters"):
            kind = item.get_str("type", required=True)
            if kind in ("RequestHeaderModifier", "ResponseHeaderModifier"):
                headers = header_filter(item, kind, headers)
            else:
                item.fail("type", f"{kind} is not supported on a backendRef")
            item.finish()
    f.finish()
    return BackendRef(ref, port, weight, headers)


_FILTER_KEYS = {
    "RequestHeaderModifier": "requestHeaderModifier",
    "ResponseHeaderModifier": "responseHeaderModifier",
}


def header_filter(item: Fields, kind: str, ops: HeaderOps) -> HeaderOps:
    """A RequestHeaderModifier / ResponseHeaderModifier filter added to `ops`."""
    f = item.need_map(_FILTER_KEYS[kind])

    def pairs(key: str) -> tuple[tuple[str, str], ...]:
        out: list[tuple[str, str]] = []
        for h in f.get_maps(key):
            out.append((h.get_str("name", required=True).lower(), h.get_str("value")))
            h.finish()
        return tuple(out)

    set_, add = pairs("set"), pairs("add")
    remove = tuple(v.lower() for _, v in f.get_strs("remove"))
    f.finish()
    if kind == "RequestHeaderModifier":
        return dataclasses.replace(
            ops,
            request_set=ops.request_set + set_,
            request_add=ops.request_add + add,
            request_remove=ops.request_remove + remove,
        )
    return dataclasses.replace(
        ops,
        response_set=ops.response_set + set_,
        response_add=ops.response_add + add,
        response_remove=ops.response_remove + remove,
    )
