"""Kind converters: validate one raw object and convert it to the model.

Each supported kind has a module with `API_VERSIONS` and `convert(ctx, domain)`. A kind name
can stand for several kinds in different API groups (Istio's `Gateway` and the Gateway API's):
each is one entry of that name, chosen by the object's apiVersion. Objects of
other kinds (or other API versions) are not errors: they are reported once as ignored, so a
directory of mixed manifests (Deployments next to Services) loads.
"""

from __future__ import annotations

from collections.abc import Callable

from control.config.fields import Context
from control.config.kinds import (
    authorizationpolicy,
    destinationrule,
    gateway,
    peerauthentication,
    secret,
    service,
    serviceentry,
    sidecar,
    telemetry,
    virtualservice,
    workloadentry,
    workloadgroup,
)
from control.config.kinds.gatewayapi import KINDS as GATEWAY_API_KINDS
from control.config.manifest import RawObject
from control.config.objects import ConfigObject, Converted
from control.model.types import ConfigWarning

Converter = Callable[[Context, str], ConfigObject]

# Per kind name: (API versions, converter), one entry per API group of that name.
CONVERTERS: dict[str, tuple[tuple[tuple[str, ...], Converter], ...]] = {
    "Service": ((service.API_VERSIONS, service.convert),),
    "Secret": ((secret.API_VERSIONS, secret.convert),),
    "WorkloadEntry": ((workloadentry.API_VERSIONS, workloadentry.convert),),
    "WorkloadGroup": ((workloadgroup.API_VERSIONS, workloadgroup.convert),),
    "ServiceEntry": ((serviceentry.API_VERSIONS, serviceentry.convert),),
    "Sidecar": ((sidecar.API_VERSIONS, sidecar.convert),),
    "VirtualService": ((virtualservice.API_VERSIONS, virtualservice.convert),),
    "DestinationRule": ((destinationrule.API_VERSIONS, destinationrule.convert),),
    "PeerAuthentication": ((peerauthentication.API_VERSIONS, peerauthentication.convert),),
    "AuthorizationPolicy": ((authorizationpolicy.API_VERSIONS, authorizationpolicy.convert),),
    "Gateway": ((gateway.API_VERSIONS, gateway.convert),),
    "Telemetry": ((telemetry.API_VERSIONS, telemetry.convert),),
}


# The Gateway API kinds (gateway.networking.k8s.io): its `Gateway` is a second entry.
for (_, _kind), (_versions, _converter, _) in GATEWAY_API_KINDS.items():
    CONVERTERS[_kind] = (*CONVERTERS.get(_kind, ()), (_versions, _converter))


def converter_for(kind: str, api_version: str) -> Converter | None:
    for versions, converter in CONVERTERS.get(kind, ()):
        if api_version in versions:
            return converter
    return None


def convert(obj: RawObject, domain: str) -> Converted:
    """Validate and convert one object; raises ConfigError for invalid objects."""
    converter = converter_for(obj.kind, obj.api_version)
    if converter is None:
        message = f"kind {obj.kind} (apiVersion {obj.api_version}) is not supported; ignored"
        return Converted(None, (ConfigWarning(obj.source, message),))
    ctx = Context(obj)
    result = converter(ctx, domain)
    return Converted(result, tuple(ctx.warnings))
