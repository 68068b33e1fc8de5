"""Istio `Gateway` (networking.istio.io) -> model Gateway: the servers a router serves.

Validation follows Istio's: HTTPS and TLS servers need `tls`; SIMPLE and MUTUAL need a
certificate (`credentialName`, or `serverCertificate` and `privateKey` files), MUTUAL a CA too;
ISTIO_MUTUAL names no certificate (the router's mesh certificate is used). A server that asks
for something we do not serve (AUTO_PASSTHROUGH, a protocol without a server
here) is reported and left out, so the gateway serves less, never something else.
"""

from __future__ import annotations

from control.config import formats
from control.config.fields import Context, Fields
from control.config.kinds.common import ISTIO_NETWORKING_VERSIONS, istio_protocol, spec_of
from control.config.manifest import format_path
from control.config.objects import ConfigObject
from control.model.gateway import Gateway, GatewayServer, ServerTls, ServerTlsMode
from control.model.types import Protocol, labels_of
from pilotfish_common.addresses import is_ip

API_VERSIONS = ISTIO_NETWORKING_VERSIONS

_TLS_MODES = tuple(m.value for m in ServerTlsMode)
_UNSERVED_TLS_MODES = ("AUTO_PASSTHROUGH",)
# The cipher suites Envoy's TLS (BoringSSL) knows by these names, as Istio's validation
# lists them: Envoy refuses a whole listener for one name it does not know.
_CIPHER_SUITES = frozenset(
    (
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "ECDHE-RSA-CHACHA20-POLY1305",
        "ECDHE-ECDSA-AES128-SHA",
        "ECDHE-RSA-AES128-SHA",
        "ECDHE-ECDSA-AES256-SHA",
        "ECDHE-RSA-AES256-SHA",
        "AES128-GCM-SHA256",
        "AES256-GCM-SHA384",
        "AES128-SHA",
        "AES256-SHA",
        "DES-CBC3-SHA",
        "ECDHE-PSK-AES128-CBC-SHA",
        "ECDHE-PSK-AES256-CBC-SHA",
        "ECDHE-PSK-CHACHA20-POLY1305",
        "PSK-AES128-CBC-SHA",
        "PSK-AES256-CBC-SHA",
    )
)
_TLS_VERSIONS = ("TLS_AUTO", "TLSV1_0", "TLSV1_1", "TLSV1_2", "TLSV1_3")
_HOST_FORM = 'must be "host", "namespace/host", "./host" or "*/host" (host may be a wildcard)'
# Server protocols a gateway listener can be (Istio also lists MONGO, served as TCP).
_SERVER_PROTOCOLS = (
    Protocol.HTTP,
    Protocol.HTTPS,
    Protocol.HTTP2,
    Protocol.GRPC,
    Protocol.TLS,
    Protocol.TCP,
)


def convert(ctx: Context, domain: str) -> ConfigObject:
    obj = ctx.obj
    spec = spec_of(ctx, formats.dns1123_subdomain)
    selector = labels_of(spec.get_labels("selector"))
    servers: list[GatewayServer] = []
    names: dict[str, str] = {}
    for item in spec.get_maps("servers", required=True):
        server = _server(item, obj.namespace)
        if server is None:
            continue
        if server.port_name:
            first = names.setdefault(server.port_name, format_path(item.path))
            if first != format_path(item.path):
                item.ctx.fail(
                    (*item.path, "port", "name"),
                    f"port name {server.port_name!r} is already used by {first}",
                )
        servers.append(server)
    spec.finish()
    if not selector:
        ctx.warn("spec.selector is empty: this Gateway selects no router")
    gateway = Gateway(
        namespace=obj.namespace,
        name=obj.name,
        source=ctx.source,
        selector=selector,
        servers=tuple(servers),
    )
    return ConfigObject(ctx.source, obj.data, gateways=(gateway,))


def _server(item: Fields, namespace: str) -> GatewayServer | None:
    port_f = item.need_map("port")
    number = port_f.need_port("number")
    port_name = port_f.get_str("name")
    if port_name and (problem := formats.dns1123_label(port_name)):
        port_f.fail("name", problem)
    protocol = istio_protocol(
        port_f, "protocol", port_f.get_str("protocol", required=True), "unknown or unsupported"
    )
    if port_f.has("targetPort"):
        item.ctx.warn_unsupported(port_f.at("targetPort"), "(the router listens on port.number)")
        port_f.ignore("targetPort")
    port_f.finish()
    if protocol not in _SERVER_PROTOCOLS:
        item.fail("port", f"protocol {protocol} cannot be a gateway server")
    hosts = tuple(
        dict.fromkeys(_host(item, path, host, namespace) for path, host in item.get_strs("hosts"))
    )
    if not hosts:
        item.fail("hosts", "is required (at least one host, e.g. '*')")
    bind = item.get_str("bind")
    if bind and not is_ip(bind):
        if bind.startswith("unix://"):
            item.fail("bind", "unix socket binds are not supported; give an IP address")
        item.fail("bind", f"must be an IP address (got {bind!r})")
    server_name = item.get_str("name")
    if item.has("defaultEndpoint"):
        item.ctx.warn_unsupported(item.at("defaultEndpoint"), "(gateways route by VirtualService)")
        item.ignore("defaultEndpoint")
    tls_f = item.get_map("tls")
    tls = None
    if tls_f is not None:
        tls = _tls(tls_f, protocol)
        if tls is None:  # a mode we do not serve: reported, server left out
            item.finish()
            return None
    item.finish()
    terminating = protocol in (Protocol.HTTPS, Protocol.TLS)
    if terminating and tls is None:
        item.fail("tls", f"is required for a {protocol} server")
    if tls is not None and not terminating and not tls.https_redirect:
        item.fail("tls", f"a plaintext {protocol} server cannot have TLS settings")
    if tls is not None and not terminating and tls.https_redirect:
        # On a plaintext server only httpsRedirect means something (Istio's usage).
        tls = ServerTls(https_redirect=True)
    del server_name  # Istio's server name labels status only
    return GatewayServer(
        port=number, protocol=protocol, port_name=port_name, hosts=hosts, bind=bind, tls=tls
    )


def _host(item: Fields, path: tuple[str | int, ...], host: str, namespace: str) -> str:
    """`ns/host` as the model keeps it: `./host` -> `<gateway ns>/host`, bare -> `*/host`."""
    ns, slash, name = host.partition("/")
    if not slash:
        ns, name = "*", host
    if not ns or not name:
        item.ctx.fail(path, f"{_HOST_FORM} (got {host!r})")
    if ns == ".":
        ns = namespace
    elif ns != "*" and (problem := formats.dns1123_label(ns)):
        item.ctx.fail(path, f"namespace {ns!r} {problem}")
    if name != "*" and (problem := formats.wildcard_host(name)):
        item.ctx.fail(path, f"host {name!r} {problem}, or '*'")
    return f"{ns}/{name.lower()}"


def _tls(f: Fields, protocol: Protocol) -> ServerTls | None:
    redirect = f.get_bool("httpsRedirect")
    mode_name = f.get_str("mode", default="SIMPLE")
    if mode_name in _UNSERVED_TLS_MODES:
        f.ctx.warn(f"{format_path(f.at('mode'))}: {mode_name} is not supported; server ignored")
        f.ignore(*f.keys())
        return None
    if mode_name not in _TLS_MODES:
        f.fail("mode", f"must be one of {', '.join(_TLS_MODES)} (got {mode_name!r})")
    mode = ServerTlsMode(mode_name)
    credential = f.get_str("credentialName")
    if credential and (problem := formats.dns1123_subdomain(credential)):
        f.fail("credentialName", f"must name a Secret: {problem}")
    cert = f.get_str("serverCertificate")
    key = f.get_str("privateKey")
    ca = f.get_str("caCertificates")
    sans = tuple(s for _, s in f.get_strs("subjectAltNames"))
    minimum = f.get_enum("minProtocolVersion", _TLS_VERSIONS, default="TLS_AUTO")
    maximum = f.get_enum("maxProtocolVersion", _TLS_VERSIONS, default="TLS_AUTO")
    if "TLS_AUTO" not in (minimum, maximum) and _TLS_VERSIONS.index(maximum) < _TLS_VERSIONS.index(
        minimum
    ):
        f.fail("maxProtocolVersion", f"{maximum} is older than minProtocolVersion {minimum}")
    ciphers: list[str] = []
    for path, name in f.get_strs("cipherSuites"):
        if name not in _CIPHER_SUITES:
            # As Istio: an unknown name is dropped with a warning, the others kept.
            f.ctx.warn(f"{format_path(path)}: unknown cipher suite {name!r}; ignored")
        elif name not in ciphers:
            ciphers.append(name)
    for unsupported in ("verifyCertificateSpki", "verifyCertificateHash"):
        if f.has(unsupported):
            f.ctx.warn_unsupported(f.at(unsupported))
            f.ignore(unsupported)
    f.finish()
    mutual = mode in (ServerTlsMode.MUTUAL, ServerTlsMode.OPTIONAL_MUTUAL)
    terminate = mode is ServerTlsMode.SIMPLE or mutual
    if mode is ServerTlsMode.ISTIO_MUTUAL and (credential or cert or key or ca):
        f.fail(
            "mode",
            "ISTIO_MUTUAL uses the router's mesh certificate: credentialName, "
            "serverCertificate, privateKey and caCertificates must not be set",
        )
    if terminate and protocol in (Protocol.HTTPS, Protocol.TLS):
        if credential and (cert or key or ca):
            f.ctx.warn(
                f"{format_path(f.path)}: credentialName is set; serverCertificate, privateKey "
                "and caCertificates are ignored"
            )
            cert = key = ca = ""
        if not credential:
            if not cert or not key:
                f.fail(
                    None,
                    f"{mode} needs credentialName, or serverCertificate and privateKey",
                )
            if mutual and not ca:
                f.fail("caCertificates", f"is required for {mode} (or use credentialName)")
    if mode is ServerTlsMode.PASSTHROUGH and (credential or cert or key):
        f.ctx.warn(
            f"{format_path(f.path)}: PASSTHROUGH does not terminate TLS; certificates ignored"
        )
        credential = cert = key = ca = ""
    return ServerTls(
        mode=mode,
        https_redirect=redirect,
        credential_name=credential,
        server_certificate=cert,
        private_key=key,
        ca_certificates=ca,
        subject_alt_names=sans,
        min_protocol_version="" if minimum == "TLS_AUTO" else minimum,
        max_protocol_version="" if maximum == "TLS_AUTO" else maximum,
        cipher_suites=tuple(ciphers),
    )
