"""Gateway API `ReferenceGrant`: which objects of other namespaces may refer to this one's."""

from __future__ import annotations

from control.config.fields import Context
from control.config.kinds.gatewayapi.refs import gateway_spec
from control.config.objects import ConfigObject
from control.model.gatewayapi import GrantFrom, GrantTo, ReferenceGrant


def convert(ctx: Context, domain: str) -> ConfigObject:
    spec = gateway_spec(ctx)
    from_: list[GrantFrom] = []
    for f in spec.get_maps("from", required=True):
        from_.append(
            GrantFrom(
                group=f.get_str("group"),
                kind=f.get_str("kind", required=True),
                namespace=f.get_str("namespace", required=True),
            )
        )
        f.finish()
    to: list[GrantTo] = []
    for f in spec.get_maps("to", required=True):
        to.append(
            GrantTo(
                group=f.get_str("group"),
                kind=f.get_str("kind", required=True),
                name=f.get_str("name"),
            )
        )
        f.finish()
    spec.finish()
    grant = ReferenceGrant(ctx.obj.namespace, ctx.obj.name, ctx.source, tuple(from_), tuple(to))
    return ConfigObject(ctx.source, ctx.obj.data, gateway_api=(grant,))
