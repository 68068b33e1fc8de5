"""Endpoints of Services without a selector, from their EndpointSlices (sans-IO).

Kubernetes manages the endpoints of a Service with a selector itself (we read those from the
pods); a Service without one gets whatever EndpointSlices name it in the label
`kubernetes.io/service-name` (written by an operator or another controller), and clients reach
those addresses. As kube-proxy does: only ready endpoints (`conditions.ready` absent counts as
ready), only IP address types (FQDN slices are deprecated and unused), port names matched with
the Service's port names. An endpoint backed by a Pod we know (`targetRef`) takes that pod's
labels and service account, so auto mTLS and policies see it as the pod it is.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

from control.model.types import WorkloadEndpointSpec, labels_of

SERVICE_NAME_LABEL = "kubernetes.io/service-name"

Key = tuple[str, str]


def slices_by_service(slices: Iterable[Mapping[str, Any]]) -> dict[Key, list[Mapping[str, Any]]]:
    """(namespace, service name) -> its EndpointSlices."""
    out: dict[Key, list[Mapping[str, Any]]] = {}
    for s in slices:
        meta = s.get("metadata") or {}
        service = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
        if service:
            out.setdefault((str(meta.get("namespace") or "default"), str(service)), []).append(s)
    return out


def slice_endpoints(
    slices: Iterable[Mapping[str, Any]], pods: Mapping[Key, Mapping[str, Any]]
) -> tuple[WorkloadEndpointSpec, ...]:
    """The ready endpoints of these slices, deduplicated by address, sorted."""
    found: dict[str, WorkloadEndpointSpec] = {}
    for s in slices:
        if s.get("addressType") not in ("IPv4", "IPv6"):
            continue
        namespace = str((s.get("metadata") or {}).get("namespace") or "default")
        ports = tuple(
            sorted(
                (str(p.get("name") or ""), int(p["port"]))
                for p in s.get("ports") or ()
                if isinstance(p.get("port"), int) and (p.get("protocol") or "TCP") == "TCP"
            )
        )
        for ep in s.get("endpoints") or ():
            if (ep.get("conditions") or {}).get("ready") is False:
                continue
            labels: Mapping[str, str] = {}
            service_account = ""
            ref = ep.get("targetRef") or {}
            if ref.get("kind") == "Pod":
                pod = pods.get((str(ref.get("namespace") or namespace), str(ref.get("name"))))
                if pod is not None:
                    labels = (pod.get("metadata") or {}).get("labels") or {}
                    service_account = str(
                        (pod.get("spec") or {}).get("serviceAccountName") or "default"
                    )
            for address in ep.get("addresses") or ():
                try:
                    ip = str(ipaddress.ip_address(address))
                except ValueError:
                    continue
                found.setdefault(
                    ip,
                    WorkloadEndpointSpec(
                        address=ip,
                        ports=ports,
                        labels=labels_of({str(k): str(v) for k, v in labels.items()}),
                        service_account=service_account,
                    ),
                )
    return tuple(found[a] for a in sorted(found))
