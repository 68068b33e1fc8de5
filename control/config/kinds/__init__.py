"""Kind converters: validate one raw object and convert it to the model.

Each supported kind has a module with `API_VERSIONS` and `convert(ctx, domain)`. Objects of
other kinds (or other API versions) are not errors: they are reported once as ignored, so a
directory of mixed manifests (Deployments next to Services) loads.
"""

from __future__ import annotations

from collections.abc import Callable

from control.config.fields import Context
from control.config.kinds import (
    authorizationpolicy,
    destinationrule,
    peerauthentication,
    secret,
    service,
    serviceentry,
    sidecar,
    virtualservice,
    workloadentry,
    workloadgroup,
)
from control.config.manifest import RawObject
from control.config.objects import ConfigObject, Converted
from control.model.types import ConfigWarning

Converter = Callable[[Context, str], ConfigObject]

CONVERTERS: dict[str, tuple[tuple[str, ...], Converter]] = {
    "Service": (service.API_VERSIONS, service.convert),
    "Secret": (secret.API_VERSIONS, secret.convert),
    "WorkloadEntry": (workloadentry.API_VERSIONS, workloadentry.convert),
    "WorkloadGroup": (workloadgroup.API_VERSIONS, workloadgroup.convert),
    "ServiceEntry": (serviceentry.API_VERSIONS, serviceentry.convert),
    "Sidecar": (sidecar.API_VERSIONS, sidecar.convert),
    "VirtualService": (virtualservice.API_VERSIONS, virtualservice.convert),
    "DestinationRule": (destinationrule.API_VERSIONS, destinationrule.convert),
    "PeerAuthentication": (peerauthentication.API_VERSIONS, peerauthentication.convert),
    "AuthorizationPolicy": (authorizationpolicy.API_VERSIONS, authorizationpolicy.convert),
}


def convert(obj: RawObject, domain: str) -> Converted:
    """Validate and convert one object; raises ConfigError for invalid objects."""
    entry = CONVERTERS.get(obj.kind)
    if entry is None or obj.api_version not in entry[0]:
        message = f"kind {obj.kind} (apiVersion {obj.api_version}) is not supported; ignored"
        return Converted(None, (ConfigWarning(obj.source, message),))
    _, converter = entry
    ctx = Context(obj)
    result = converter(ctx, domain)
    return Converted(result, tuple(ctx.warnings))
