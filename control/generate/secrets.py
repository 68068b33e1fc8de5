"""SDS over ADS for routers: the gateway certificates (`v1 Secret`s) as Envoy `Secret`
resources, named as the router's Envoy asks its agent for them (`kubernetes://<name>`,
`kubernetes://<name>-cacert`, `kubernetes://<namespace>/<name>[-cacert]`,
control/model/secret.py).

A router gets the Secrets of its own namespace, and those of other namespaces that the index's
ReferenceGrants let it read. Who may subscribe at all is decided before anything is sent
(control/secretaccess.py, the xDS server's subscription guard): a sidecar's or another
namespace's stream is refused there and never reaches this generator's answer. The set is the
same for every router of a namespace and is built once per push; each resource is serialized
once per content (rule 8), so a rotation re-encodes just the Secret that changed.
"""

from __future__ import annotations

from envoy.extensions.transport_sockets.tls.v3.secret_pb2 import Secret

from control.generate.context import GenContext
from control.model.proxy import Proxy
from control.model.secret import SDS_PREFIX, Served, served_names
from control.xds.cache import EMPTY, Resource, ResourceSet
from protos.typeurls import SECRET


def generate(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    if not proxy.is_router:
        return EMPTY
    namespace = proxy.namespace
    return ctx.memo(("secrets", namespace), lambda: _namespace_set(ctx, namespace))


def _namespace_set(ctx: GenContext, namespace: str) -> ResourceSet:
    index = ctx.index.secrets
    out: list[Resource] = []
    own = served_names(index.in_namespace(namespace).values())
    for short, served in own.items():
        out.append(_resource(ctx, f"{SDS_PREFIX}{short}", served, namespace))
        out.append(_resource(ctx, f"{SDS_PREFIX}{namespace}/{short}", served, namespace))
    grants = ctx.index.secret_grants
    for other in index.namespaces():
        if other == namespace:
            continue
        for short, served in served_names(index.in_namespace(other).values()).items():
            if grants.allows_secret(namespace, other, served.secret.name):
                out.append(_resource(ctx, f"{SDS_PREFIX}{other}/{short}", served, namespace))
    return ResourceSet(out) if out else EMPTY


def _resource(ctx: GenContext, name: str, served: Served, namespace: str) -> Resource:
    # The short names mean another Secret in each namespace: one cache slot per namespace.
    key = (served.secret, served.ca)
    return ctx.resource(SECRET, name, key, lambda: build(name, served), variant=namespace)


def build(name: str, served: Served) -> Secret:
    s = Secret(name=name)
    secret = served.secret
    if served.ca:
        s.validation_context.trusted_ca.inline_bytes = secret.ca_cert
    else:
        s.tls_certificate.certificate_chain.inline_bytes = secret.cert_chain
        s.tls_certificate.private_key.inline_bytes = secret.private_key
    return s
