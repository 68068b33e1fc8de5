"""Gateway API status as the API server stores it, and whether it must be written (sans-IO).

`render` gives the `status` stanza we own for one object: `conditions` (GatewayClass,
Gateway), `listeners` (Gateway), `parents` (routes; entries of other controllers are kept as
they are). A condition keeps its `lastTransitionTime` while its status stays the same, so
writing the same status twice changes nothing, and `patch` answers None then: status is only
written when it changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from control.model.gatewayapi import (
    CONTROLLER_NAME,
    CONTROLLER_NAMES,
    Condition,
    ObjectStatus,
    ParentStatus,
)

Json = dict[str, Any]


def _conditions(
    conditions: tuple[Condition, ...],
    generation: int,
    existing: Any,
    now: str | None,
) -> list[Json]:
    before = {c.get("type"): c for c in existing or () if isinstance(c, Mapping) and c.get("type")}
    out: list[Json] = []
    for c in conditions:
        status = "True" if c.status else "False"
        item: Json = {
            "type": c.type,
            "status": status,
            "reason": c.reason,
            "message": c.message,
            "observedGeneration": generation,
        }
        if now is not None:
            old = before.get(c.type) or {}
            kept = old.get("lastTransitionTime") if old.get("status") == status else None
            item["lastTransitionTime"] = kept or now
        out.append(item)
    return out


def _parent_ref(p: ParentStatus) -> Json:
    return dict(p.parent.written) or {"name": p.parent.name}


def _same_parent(entry: Mapping[str, Any], ref: Json) -> bool:
    return entry.get("controllerName") in CONTROLLER_NAMES and entry.get("parentRef") == ref


def render(status: ObjectStatus, existing: Mapping[str, Any] | None, now: str | None) -> Json:
    """The status keys we own, merged with the object's current `status` (`existing`).
    `now` (RFC 3339) stamps conditions that changed; None leaves the times out (for views)."""
    old = existing or {}
    if status.is_route:
        old_parents = [p for p in old.get("parents") or () if isinstance(p, Mapping)]
        parents: list[Json] = []
        for p in status.parents:
            ref = _parent_ref(p)
            previous = next((e for e in old_parents if _same_parent(e, ref)), {})
            parents.append(
                {
                    "parentRef": ref,
                    "controllerName": CONTROLLER_NAME,
                    "conditions": _conditions(
                        p.conditions, status.generation, previous.get("conditions"), now
                    ),
                }
            )
        others = [dict(e) for e in old_parents if e.get("controllerName") not in CONTROLLER_NAMES]
        return {"parents": others + parents}
    out: Json = {
        "conditions": _conditions(status.conditions, status.generation, old.get("conditions"), now)
    }
    if status.kind == "Gateway":
        old_listeners = {
            str(ls.get("name")): ls for ls in old.get("listeners") or () if isinstance(ls, Mapping)
        }
        out["listeners"] = [
            {
                "name": ls.name,
                "supportedKinds": [{"group": g, "kind": k} for g, k in ls.supported_kinds],
                "attachedRoutes": ls.attached_routes,
                "conditions": _conditions(
                    ls.conditions,
                    status.generation,
                    (old_listeners.get(ls.name) or {}).get("conditions"),
                    now,
                ),
            }
            for ls in status.listeners
        ]
    return out


def patch(status: ObjectStatus, existing: Mapping[str, Any] | None, now: str) -> Json | None:
    """The merge-patch body for `.../status`, or None when the object already says it."""
    body = render(status, existing, now)
    old = existing or {}
    if all(old.get(key) == value for key, value in body.items()):
        return None
    return {"status": body}


def as_json(status: ObjectStatus) -> Json:
    """One status for /debug/configz: which object, and the status we would write."""
    return {
        "kind": status.kind,
        "namespace": status.namespace,
        "name": status.name,
        "status": render(status, None, None),
    }
