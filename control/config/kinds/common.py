"""Pieces shared by the kind converters: the envelope, selectors, addresses."""

from __future__ import annotations

from collections.abc import Callable

from control.config import formats, protocols
from control.config.fields import Context, Fields
from control.model.types import Labels, Protocol, labels_of
from pilotfish_common.addresses import is_ip

ISTIO_NETWORKING_VERSIONS = (
    "networking.istio.io/v1",
    "networking.istio.io/v1beta1",
    "networking.istio.io/v1alpha3",
)

# Metadata that has no effect on the mesh (bookkeeping written by tools and the API server).
_METADATA_KEYS = (
    "name",
    "namespace",
    "labels",
    "annotations",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "ownerReferences",
    "finalizers",
    "selfLink",
)


def spec_of(ctx: Context, check_name: Callable[[str], str | None]) -> Fields:
    """Check the envelope of an object and return its `spec` (required).

    Unknown top-level keys are reported; `status` is output-only and skipped silently.
    """
    root = envelope_of(ctx, check_name)
    spec = root.need_map("spec")
    root.finish()
    return spec


def envelope_of(ctx: Context, check_name: Callable[[str], str | None]) -> Fields:
    """Check `apiVersion`, `kind`, `metadata` (and skip `status`); the top level, for kinds
    without a `spec` (a Secret) to read the rest of."""
    root = ctx.root()
    root.ignore("apiVersion", "kind", "status")
    metadata = root.need_map("metadata")
    metadata.ignore(*_METADATA_KEYS)
    if problem := check_name(ctx.obj.name):
        metadata.fail("name", problem)
    metadata.finish()
    return root


def istio_protocol(f: Fields, key: str, name: str, unknown: str = "unknown") -> Protocol:
    """The protocol Istio calls `name` (the value of `f[key]`); fails `key`, naming the
    protocols we serve, when we do not know or cannot serve it."""
    protocol = protocols.from_istio_name(name)
    if protocol is None:
        f.fail(key, f"{unknown} protocol {name!r}; use one of {', '.join(protocols.ISTIO_NAMES)}")
    return protocol


def selector_labels(spec: Fields, key: str = "workloadSelector") -> Labels | None:
    """An Istio `workloadSelector: {labels: {...}}`; None when absent."""
    selector = spec.get_map(key)
    if selector is None:
        return None
    labels = selector.get_labels("labels")
    selector.finish()
    return labels_of(labels)


def check_endpoint_address(f: Fields, key: str, value: str, *, allow_hostname: bool) -> None:
    """An endpoint address: an IP, a hostname (when allowed) or a `unix://` socket path."""
    if is_ip(value):
        return
    if value.startswith("unix://"):
        if value.startswith(("unix:///", "unix://@")) and len(value) > len("unix:///"):
            return
        f.fail(key, f"unix socket address {value!r} must be unix:///absolute/path")
    if allow_hostname and formats.is_hostname(value):
        return
    expected = "an IP address or a hostname" if allow_hostname else "an IP address"
    f.fail(key, f"must be {expected} (got {value!r})")


def resolve_host(host: str, namespace: str, domain: str) -> str:
    """Istio's short-name rule for VirtualService and DestinationRule hosts: a name without a
    dot is a service of the object's namespace (`reviews` -> `reviews.NS.svc.DOMAIN`); every
    other name (FQDN, `reviews.default`, wildcard) is taken as written."""
    if host == "*" or "." in host:
        return host
    return f"{host}.{namespace}.svc.{domain}"


def check_host(f: Fields, path: tuple[str | int, ...], host: str) -> None:
    """A VirtualService/DestinationRule host: a DNS name, optionally with a leading `*.`."""
    if host == "*":
        return
    if problem := formats.wildcard_host(host):
        f.ctx.fail(path, f"{problem} (got {host!r})")


def export_to(spec: Fields) -> tuple[str, ...]:
    """`exportTo`: `*`, `.`, or namespace names; absent -> everywhere."""
    values: list[str] = []
    for path, value in spec.get_strs("exportTo"):
        if value not in ("*", ".") and (problem := formats.dns1123_label(value)):
            spec.ctx.fail(path, f"must be '*', '.' or a namespace name: {problem}")
        if value not in values:
            values.append(value)
    if "*" in values and len(values) > 1:
        spec.fail("exportTo", "'*' cannot be combined with other values")
    return tuple(values) or ("*",)
