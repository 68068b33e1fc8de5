"""Istio `PeerAuthentication` -> model PeerAuthentication (inbound mTLS mode)."""

from __future__ import annotations

from control.config import formats
from control.config.fields import Context, Fields
from control.config.kinds.common import spec_of
from control.config.kinds.security import SECURITY_VERSIONS, match_labels
from control.config.objects import ConfigObject
from control.model.types import ROOT_NAMESPACE, MtlsMode, PeerAuthentication

API_VERSIONS = SECURITY_VERSIONS

_MODES = tuple(m.value for m in MtlsMode)


def convert(ctx: Context, domain: str) -> ConfigObject:
    obj = ctx.obj
    spec = spec_of(ctx, formats.dns1123_subdomain)
    selector = match_labels(spec)
    mode = _mode(spec.get_map("mtls"))
    port_modes = _port_modes(spec, selector is not None)
    spec.finish()
    if selector is not None and obj.namespace == ROOT_NAMESPACE:
        # As in Istio: the root namespace holds the mesh-wide policy; a selector there would
        # make it neither mesh-wide nor namespace-wide, and Istio ignores it.
        ctx.warn(
            f"spec.selector in the root namespace {ROOT_NAMESPACE} is not supported; "
            "this policy is ignored (use a policy without selector for the whole mesh)"
        )
        return ConfigObject(ctx.source, obj.data)
    policy = PeerAuthentication(
        namespace=obj.namespace,
        name=obj.name,
        source=ctx.source,
        selector=selector,
        mode=mode,
        port_modes=port_modes,
    )
    return ConfigObject(ctx.source, obj.data, peer_authentications=(policy,))


def _mode(mtls: Fields | None) -> MtlsMode:
    if mtls is None:
        return MtlsMode.UNSET
    mode = MtlsMode(mtls.get_enum("mode", _MODES, default="UNSET"))
    mtls.finish()
    return mode


def _port_modes(spec: Fields, has_selector: bool) -> tuple[tuple[int, MtlsMode], ...]:
    out: dict[int, MtlsMode] = {}
    for path, key, value in spec.get_items("portLevelMtls"):
        if not has_selector:
            spec.fail(
                "portLevelMtls",
                "needs a selector: port-level mTLS applies to the ports of selected workloads",
            )
        # YAML keys may be read as numbers (8080:) or strings ("8080":); both mean the port.
        text = str(key)
        if isinstance(key, bool) or not text.isdigit() or not 1 <= int(text) <= 65535:
            spec.ctx.fail(path, f"port {text!r} must be an integer 1-65535")
        if not isinstance(value, dict):
            spec.ctx.fail(path, "must be a mapping like {mode: DISABLE}")
        out[int(text)] = _mode(Fields(spec.ctx, path, value))
    return tuple(sorted(out.items()))
