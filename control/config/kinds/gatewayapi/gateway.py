"""Gateway API `GatewayClass` and `Gateway` -> their model forms (validated, unresolved)."""

from __future__ import annotations

from control.config.fields import Context, Fields
from control.config.kinds.gatewayapi.refs import (
    check_hostname,
    gateway_spec,
    generation,
    object_ref,
)
from control.config.objects import ConfigObject
from control.model.gatewayapi import (
    GROUP,
    ApiGateway,
    FromNamespaces,
    GatewayClass,
    GroupKind,
    LabelSelector,
    Listener,
    ObjectRef,
    TlsMode,
)
from control.model.types import labels_of

_SELECTOR_OPS = ("In", "NotIn", "Exists", "DoesNotExist")


def convert_class(ctx: Context, domain: str) -> ConfigObject:
    spec = gateway_spec(ctx)
    controller = spec.get_str("controllerName", required=True)
    spec.ignore("description")
    if spec.has("parametersRef"):
        ctx.warn_unsupported(spec.at("parametersRef"))
        spec.ignore("parametersRef")
    spec.finish()
    gc = GatewayClass(ctx.obj.name, ctx.source, controller, generation(ctx))
    return ConfigObject(ctx.source, ctx.obj.data, gateway_api=(gc,))


def convert_gateway(ctx: Context, domain: str) -> ConfigObject:
    spec = gateway_spec(ctx)
    class_name = spec.get_str("gatewayClassName", required=True)
    listeners: list[Listener] = []
    for f in spec.get_maps("listeners", required=True):
        listener = _listener(f)
        if any(other.name == listener.name for other in listeners):
            f.fail("name", f"listener name {listener.name!r} is used twice")
        listeners.append(listener)
    for key in ("addresses", "infrastructure", "backendTLS", "allowedListeners"):
        if spec.has(key):
            ctx.warn_unsupported(spec.at(key))
            spec.ignore(key)
    spec.finish()
    gw = ApiGateway(
        namespace=ctx.obj.namespace,
        name=ctx.obj.name,
        source=ctx.source,
        class_name=class_name,
        listeners=tuple(listeners),
        generation=generation(ctx),
    )
    return ConfigObject(ctx.source, ctx.obj.data, gateway_api=(gw,))


def _listener(f: Fields) -> Listener:
    name = f.get_str("name", required=True)
    port = f.need_port("port")
    protocol = f.get_str("protocol", required=True)
    hostname = f.get_str("hostname").lower()
    if hostname:
        check_hostname(f, f.at("hostname"), hostname)
    tls_mode: TlsMode | None = None
    refs: tuple[ObjectRef, ...] = ()
    tls = f.get_map("tls")
    if tls is not None:
        tls_mode = TlsMode(
            tls.get_enum("mode", tuple(m.value for m in TlsMode), default=TlsMode.TERMINATE.value)
        )
        refs = _certificate_refs(tls)
        for key in ("options", "frontendValidation"):
            if tls.has(key):
                f.ctx.warn_unsupported(tls.at(key))
                tls.ignore(key)
        tls.finish()
    from_namespaces = FromNamespaces.SAME
    selector: LabelSelector | None = None
    kinds: list[GroupKind] = []
    allowed = f.get_map("allowedRoutes")
    if allowed is not None:
        namespaces = allowed.get_map("namespaces")
        if namespaces is not None:
            from_namespaces = FromNamespaces(
                namespaces.get_enum(
                    "from", tuple(v.value for v in FromNamespaces), default=FromNamespaces.SAME
                )
            )
            selector = label_selector(namespaces.get_map("selector"))
            if from_namespaces is FromNamespaces.SELECTOR and selector is None:
                namespaces.fail("selector", "is required when from is Selector")
            namespaces.finish()
        for k in allowed.get_maps("kinds"):
            kinds.append((k.get_str("group", default=GROUP), k.get_str("kind", required=True)))
            k.finish()
        allowed.finish()
    f.finish()
    return Listener(
        name=name,
        port=port,
        protocol=protocol,
        hostname=hostname,
        tls_mode=tls_mode,
        certificate_refs=refs,
        from_namespaces=from_namespaces,
        namespace_selector=selector,
        kinds=tuple(kinds),
    )


def _certificate_refs(tls: Fields) -> tuple[ObjectRef, ...]:
    out = []
    for r in tls.get_maps("certificateRefs"):
        out.append(object_ref(r, default_group="", default_kind="Secret"))
        r.finish()
    return tuple(out)


def label_selector(f: Fields | None) -> LabelSelector | None:
    if f is None:
        return None
    labels = labels_of(f.get_labels("matchLabels"))
    expressions: list[tuple[str, str, tuple[str, ...]]] = []
    for e in f.get_maps("matchExpressions"):
        key = e.get_str("key", required=True)
        op = e.get_enum("operator", _SELECTOR_OPS, default="")
        values = tuple(v for _, v in e.get_strs("values"))
        if op in ("In", "NotIn") and not values:
            e.fail("values", f"is required for operator {op}")
        expressions.append((key, op, values))
        e.finish()
    f.finish()
    return LabelSelector(labels, tuple(expressions))
