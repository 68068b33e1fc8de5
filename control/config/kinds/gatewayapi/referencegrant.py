"""Gateway API `ReferenceGrant`: which objects of other namespaces may refer to this one's."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from control.config.fields import Context, Fields
from control.config.kinds.gatewayapi.refs import gateway_spec
from control.config.objects import ConfigObject
from control.model.gatewayapi import GrantFrom, GrantTo, ReferenceGrant

T = TypeVar("T", GrantFrom, GrantTo)


def convert(ctx: Context, domain: str) -> ConfigObject:
    spec = gateway_spec(ctx)
    from_ = _entries(spec, "from", "namespace", GrantFrom)
    to = _entries(spec, "to", "name", GrantTo)
    spec.finish()
    grant = ReferenceGrant(ctx.obj.namespace, ctx.obj.name, ctx.source, from_, to)
    return ConfigObject(ctx.source, ctx.obj.data, gateway_api=(grant,))


def _entries(
    spec: Fields, key: str, last: str, make: Callable[[str, str, str], T]
) -> tuple[T, ...]:
    """`from` entries (group, kind, namespace: required) or `to` entries (group, kind,
    name: optional), checked in that order."""
    out: list[T] = []
    for f in spec.get_maps(key, required=True):
        out.append(
            make(
                f.get_str("group"),
                f.get_str("kind", required=True),
                f.get_str(last, required=last == "namespace"),
            )
        )
        f.finish()
    return tuple(out)
