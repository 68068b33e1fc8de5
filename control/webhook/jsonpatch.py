"""JSON patches (RFC 6902) as injection writes them: only `add`, keys escaped as RFC 6901
says; and applying one as the API server does (kube-inject, tests).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any


def apply_patch(doc: Mapping[str, Any], patch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The document with the patch applied (RFC 6902 `add`, the only op injection emits),
    as the API server applies it; the input is not modified."""
    out: dict[str, Any] = copy.deepcopy(dict(doc))
    for op in patch:
        if op.get("op") != "add":
            raise ValueError(f"unsupported patch op {op.get('op')!r}")
        *parents, last = [_unescape(p) for p in str(op["path"]).split("/")[1:]]
        target: Any = out
        for p in parents:
            target = target[int(p)] if isinstance(target, list) else target[p]
        value = copy.deepcopy(op["value"])
        if isinstance(target, list):
            if last == "-":
                target.append(value)
            else:
                target.insert(int(last), value)
        else:
            target[last] = value
    return out


def append(path: str, existing: object, items: Sequence[Any]) -> list[dict[str, Any]]:
    if not items:
        return []
    if existing:
        return [{"op": "add", "path": f"{path}/-", "value": item} for item in items]
    return [{"op": "add", "path": path, "value": list(items)}]


def set_key(path: str, existing: object, key: str, value: str) -> list[dict[str, Any]]:
    return set_keys(path, existing, {key: value})


def set_keys(path: str, existing: object, items: Mapping[str, str]) -> list[dict[str, Any]]:
    if isinstance(existing, Mapping) and existing:
        return [{"op": "add", "path": f"{path}/{_escape(k)}", "value": v} for k, v in items.items()]
    return [{"op": "add", "path": path, "value": dict(items)}]


def _escape(token: str) -> str:
    """RFC 6901: `~` and `/` inside a key (label keys have slashes)."""
    return token.replace("~", "~0").replace("/", "~1")


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")
