"""The config view (sans-IO): every loaded object with where it came from, the warnings about
it and its status (Gateway API objects carry `status` once the control plane computes it),
the mesh-wide warnings, and the `file:line: reason` of every input that currently fails
(its last good config is still served)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from control.config.errors import ConfigError
from control.model.types import MeshConfig, SourceRef


def _key(ref: SourceRef) -> tuple[str, str, str]:
    return (ref.kind, ref.namespace, ref.name)


def config_json(
    config: MeshConfig,
    errors: Mapping[str, ConfigError],
    namespaces: frozenset[str] | None = None,
    kinds: frozenset[str] | None = None,
    statuses: Iterable[Mapping[str, Any]] = (),
) -> dict[str, object]:
    """`statuses`: status the control plane computed for objects (Gateway API: `kind`,
    `namespace`, `name`, `status`, and the API `group` when the kind alone is ambiguous, as
    Istio's and Kubernetes' `Gateway` are), shown instead of the status an object was loaded
    with."""
    computed: dict[tuple[str, str, str], list[tuple[str, object]]] = {}
    for row in statuses:
        key = (str(row.get("kind", "")), str(row.get("namespace", "")), str(row.get("name", "")))
        computed.setdefault(key, []).append((str(row.get("group", "")), row.get("status")))
    by_object: dict[tuple[str, str, str], list[str]] = {}
    loose: list[dict[str, object]] = []
    for w in config.warnings:
        if w.source.name:
            by_object.setdefault(_key(w.source), []).append(w.message)
        else:
            loose.append(_where(w.source) | {"message": w.message})
    objects = []
    for ref, obj in config.raw:
        if namespaces and ref.namespace not in namespaces:
            continue
        if kinds and ref.kind not in kinds:
            continue
        raw: Mapping[str, Any] = obj
        api_version = str(raw.get("apiVersion", ""))
        group = api_version.rpartition("/")[0]
        # Cluster-scoped kinds (GatewayClass) have no namespace in their status.
        candidates = computed.get(_key(ref)) or computed.get((ref.kind, "", ref.name), [])
        status = next(
            (st for g, st in candidates if not g or g == group),
            raw.get("status"),
        )
        objects.append(
            {
                "kind": ref.kind,
                "apiVersion": api_version,
                "namespace": ref.namespace,
                "name": ref.name,
                **_where(ref),
                "warnings": by_object.get(_key(ref), []),
                "status": status,
                "spec": raw.get("spec"),
            }
        )
    known = {(o["kind"], o["namespace"], o["name"]) for o in objects}
    # Warnings about objects that were not loaded (rejected) still belong on the page.
    for key, messages in sorted(by_object.items()):
        if key not in known and (not namespaces or key[1] in namespaces):
            loose.extend({"object": "/".join(key), "message": m} for m in messages)
    return {
        "objects": objects,
        "warnings": loose,
        "errors": [
            {"file": e.file, "line": e.line, "reason": e.reason, "message": str(e)}
            for _, e in sorted(errors.items())
        ],
        "kinds": sorted({ref.kind for ref, _ in config.raw}),
        "namespaces": sorted({ref.namespace for ref, _ in config.raw if ref.namespace}),
    }


def _where(ref: SourceRef) -> dict[str, object]:
    return {"file": ref.file, "line": ref.line}
