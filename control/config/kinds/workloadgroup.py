"""Istio `WorkloadGroup` -> model WorkloadGroup (the template auto-registered workloads are made
from; control/registry/autoregister.py decides who may join it)."""

from __future__ import annotations

import dataclasses

from control.config import formats
from control.config.fields import Context, Fields
from control.config.kinds.common import ISTIO_NETWORKING_VERSIONS, spec_of
from control.config.kinds.workloadentry import endpoint_fields
from control.config.objects import ConfigObject
from control.model.types import labels_of
from control.model.workloadgroup import WorkloadGroup, WorkloadProbe

API_VERSIONS = ISTIO_NETWORKING_VERSIONS

_PROBE_KINDS = ("httpGet", "tcpSocket", "exec", "grpc")
_SCHEMES = ("HTTP", "HTTPS")
_MAX_SECONDS = 2**31 - 1


def convert(ctx: Context, domain: str) -> ConfigObject:
    obj = ctx.obj
    spec = spec_of(ctx, formats.dns1123_subdomain)
    meta_labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    meta = spec.get_map("metadata")
    if meta is not None:
        meta_labels = meta.get_labels("labels") or {}
        annotations = _annotations(meta)
        meta.finish()
    template = spec.need_map("template")
    if template.has("address"):
        # Every registered workload has its proxy's address; one in the template would be
        # shared by all of them.
        template.fail("address", "must not be set in a WorkloadGroup template")
    template.ignore("address")
    labels = {**(template.get_labels("labels") or {}), **meta_labels}
    endpoint = endpoint_fields(ctx, template)
    template.finish()
    probe = _probe(spec)
    spec.finish()

    group = WorkloadGroup(
        namespace=obj.namespace,
        name=obj.name,
        source=ctx.source,
        labels=labels_of(labels),
        annotations=labels_of(annotations),
        service_account=endpoint.service_account or "default",
        ports=endpoint.ports,
        locality=endpoint.locality,
        weight=endpoint.weight,
        probe=probe,
    )
    return ConfigObject(ctx.source, obj.data, workload_groups=(group,))


def _annotations(meta: Fields) -> dict[str, str]:
    out: dict[str, str] = {}
    for path, key, value in meta.get_items("annotations"):
        if problem := formats.label_key(key):
            meta.ctx.fail(path, problem.replace("label key", "annotation key"))
        if not isinstance(value, str):
            meta.ctx.fail(path, "annotation values must be strings")
        out[key] = value
    return out


def _probe(spec: Fields) -> WorkloadProbe | None:
    """Validated so a bad probe is caught now. The members' agents run httpGet, tcpSocket and
    grpc probes (agent/health/); `exec` is not run, so it is reported (once) as unsupported
    rather than silently doing nothing."""
    f = spec.get_map("probe")
    if f is None:
        return None
    d = WorkloadProbe(kind="")

    def seconds(key: str, default: int) -> int:
        # Protobuf zero is unset: Kubernetes' defaults apply, as in Istio.
        return f.get_int(key, maximum=_MAX_SECONDS) or default

    initial_delay = seconds("initialDelaySeconds", d.initial_delay_seconds)
    timeout = seconds("timeoutSeconds", d.timeout_seconds)
    period = seconds("periodSeconds", d.period_seconds)
    success = seconds("successThreshold", d.success_threshold)
    failure = seconds("failureThreshold", d.failure_threshold)
    present = [k for k in _PROBE_KINDS if f.has(k)]
    if len(present) != 1:
        f.fail(None, f"must set exactly one of {', '.join(_PROBE_KINDS)}")
    kind = present[0]
    action = f.need_map(kind)
    if kind == "httpGet":
        headers: list[tuple[str, str]] = []
        for h in action.get_maps("httpHeaders"):
            headers.append((h.get_str("name", required=True), h.get_str("value")))
            h.finish()
        probe = WorkloadProbe(
            kind,
            port=action.need_port("port"),
            host=action.get_str("host"),
            path=action.get_str("path"),
            scheme=action.get_enum("scheme", _SCHEMES, default="HTTP"),
            headers=tuple(headers),
        )
    elif kind == "tcpSocket":
        probe = WorkloadProbe(kind, port=action.need_port("port"), host=action.get_str("host"))
    elif kind == "exec":
        command = tuple(c for _, c in action.get_strs("command", required=True))
        probe = WorkloadProbe(kind, command=command)
    else:
        probe = WorkloadProbe(
            kind, port=action.need_port("port"), service=action.get_str("service")
        )
    action.finish()
    f.finish()
    if kind == "exec":
        f.ctx.warn_unsupported(
            spec.at("probe"), "(exec probes are not run: members count as healthy)"
        )
    return dataclasses.replace(
        probe,
        initial_delay_seconds=initial_delay,
        timeout_seconds=timeout,
        period_seconds=period,
        success_threshold=success,
        failure_threshold=failure,
    )
