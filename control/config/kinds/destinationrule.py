"""Istio `DestinationRule` -> model DestinationRule (subsets and client-side traffic policy)."""

from __future__ import annotations

from control.config import formats
from control.config.fields import Context, Fields
from control.config.kinds.common import (
    ISTIO_NETWORKING_VERSIONS,
    check_host,
    export_to,
    resolve_host,
    spec_of,
)
from control.config.kinds.security import match_labels
from control.config.locality import locality_lb_setting
from control.config.manifest import format_path
from control.config.objects import ConfigObject
from control.model.traffic import (
    ClientTls,
    ConnectionPool,
    ConsistentHash,
    DestinationRule,
    LbPolicy,
    LoadBalancer,
    OutlierDetection,
    Subset,
    TlsMode,
    TrafficPolicy,
)
from control.model.types import labels_of

API_VERSIONS = ISTIO_NETWORKING_VERSIONS

_SIMPLE_LB = tuple(p.value for p in LbPolicy)
_TLS_MODES = tuple(m.value for m in TlsMode)
_H2_UPGRADE = ("DEFAULT", "DO_NOT_UPGRADE", "UPGRADE")


def convert(ctx: Context, domain: str) -> ConfigObject:
    obj = ctx.obj
    spec = spec_of(ctx, formats.dns1123_subdomain)
    host = spec.get_str("host", required=True)
    check_host(spec, spec.at("host"), host)
    policy = traffic_policy(spec.get_map("trafficPolicy"), port_level=True)
    subsets: list[Subset] = []
    for item in spec.get_maps("subsets"):
        name = item.get_str("name", required=True)
        if problem := formats.dns1123_label(name):
            item.fail("name", problem)
        if any(s.name == name for s in subsets):
            item.fail("name", f"duplicate subset {name!r}")
        labels = item.get_labels("labels") or {}
        sub_policy = traffic_policy(item.get_map("trafficPolicy"), port_level=True)
        item.finish()
        subsets.append(Subset(name, labels_of(labels), sub_policy))
    selector = match_labels(spec, "workloadSelector")
    exports = export_to(spec)
    if selector is not None and any(e not in (".", obj.namespace) for e in exports):
        if spec.has("exportTo"):
            spec.fail("exportTo", "with workloadSelector may only be '.' (its own namespace)")
        exports = (".",)  # a selected rule applies in its namespace only, as Istio's
    spec.finish()
    rule = DestinationRule(
        namespace=obj.namespace,
        name=obj.name,
        source=ctx.source,
        host=resolve_host(host, obj.namespace, domain),
        policy=policy,
        subsets=tuple(subsets),
        export_to=exports,
        workload_selector=selector,
    )
    return ConfigObject(ctx.source, obj.data, destination_rules=(rule,))


def traffic_policy(f: Fields | None, *, port_level: bool) -> TrafficPolicy | None:
    if f is None:
        return None
    port_settings: list[tuple[int, TrafficPolicy]] = []
    if port_level:
        for item in f.get_maps("portLevelSettings"):
            port = item.need_map("port")
            number = port.need_port("number")
            port.finish()
            if any(n == number for n, _ in port_settings):
                item.fail("port", f"duplicate port {number}")
            sub = traffic_policy(item, port_level=False) or TrafficPolicy()
            port_settings.append((number, sub))
    policy = TrafficPolicy(
        load_balancer=_load_balancer(f.get_map("loadBalancer")),
        connection_pool=_connection_pool(f.get_map("connectionPool")),
        outlier_detection=_outlier(f.get_map("outlierDetection")),
        tls=_tls(f.get_map("tls")),
        port_settings=tuple(sorted(port_settings)),
    )
    locality = policy.load_balancer.locality if policy.load_balancer else None
    if (
        locality is not None
        and (locality.failover or locality.failover_priority)
        and policy.outlier_detection is None
    ):
        # As Istio: without it Envoy never sees local endpoints fail, so never fails over.
        f.ctx.warn(
            f"{format_path(f.at('loadBalancer'))}: localityLbSetting failover needs "
            "outlierDetection; without it, it has no effect"
        )
    if not port_level:
        f.ignore("port")
    f.finish()
    return policy


def _load_balancer(f: Fields | None) -> LoadBalancer | None:
    if f is None:
        return None
    simple = f.get_str("simple")
    hashed = f.get_map("consistentHash")
    if simple and hashed is not None:
        f.fail(None, "set either simple or consistentHash, not both")
    locality_f = f.get_map("localityLbSetting")
    locality = None if locality_f is None else locality_lb_setting(locality_f)
    result = LoadBalancer(locality=locality)
    if simple:
        if simple == "PASSTHROUGH":
            f.fail("simple", "PASSTHROUGH is not supported (it needs traffic capture)")
        choice = f.get_enum("simple", (*_SIMPLE_LB, "UNSPECIFIED"), default="UNSPECIFIED")
        if choice != "UNSPECIFIED":
            result = LoadBalancer(simple=LbPolicy(choice), locality=locality)
    elif hashed is not None:
        result = LoadBalancer(consistent_hash=_consistent_hash(hashed), locality=locality)
    f.finish()
    return result


def _consistent_hash(f: Fields) -> ConsistentHash:
    header = f.get_str("httpHeaderName")
    query = f.get_str("httpQueryParameterName")
    source_ip = f.get_bool("useSourceIp")
    cookie = f.get_map("httpCookie")
    cookie_name, cookie_path, cookie_ttl = "", "", None
    if cookie is not None:
        cookie_name = cookie.get_str("name", required=True)
        cookie_path = cookie.get_str("path")
        cookie_ttl = cookie.get_duration("ttl")
        cookie.finish()
    chosen = sum(bool(x) for x in (header, query, source_ip, cookie_name))
    if chosen != 1:
        f.fail(
            None,
            "set exactly one of httpHeaderName, httpCookie, useSourceIp, httpQueryParameterName",
        )
    ring = f.get_int("minimumRingSize") or 0
    ring_hash = f.get_map("ringHash")
    if ring_hash is not None:
        ring = ring_hash.get_int("minimumRingSize") or ring
        ring_hash.finish()
    maglev = f.get_map("maglev")
    if maglev is not None:
        maglev.ignore("tableSize")
        if maglev.has("tableSize"):
            f.ctx.warn_unsupported(maglev.at("tableSize"))
        maglev.finish()
    f.finish()
    return ConsistentHash(
        header=header,
        cookie=cookie_name,
        cookie_path=cookie_path,
        cookie_ttl=cookie_ttl,
        source_ip=source_ip,
        query_param=query,
        minimum_ring_size=ring,
        maglev=maglev is not None,
    )


def _connection_pool(f: Fields | None) -> ConnectionPool | None:
    if f is None:
        return None
    tcp = f.get_map("tcp")
    http = f.get_map("http")
    pool = ConnectionPool()
    if tcp is not None:
        pool = ConnectionPool(
            max_connections=tcp.get_int("maxConnections", minimum=1),
            connect_timeout=tcp.get_duration("connectTimeout", positive=True),
        )
        tcp.finish()
    if http is not None:
        upgrade = http.get_enum("h2UpgradePolicy", _H2_UPGRADE, default="DEFAULT")
        pool = ConnectionPool(
            max_connections=pool.max_connections,
            connect_timeout=pool.connect_timeout,
            http1_max_pending_requests=http.get_int("http1MaxPendingRequests", minimum=1),
            http2_max_requests=http.get_int("http2MaxRequests", minimum=1),
            max_requests_per_connection=http.get_int("maxRequestsPerConnection", minimum=0),
            max_retries=http.get_int("maxRetries", minimum=0),
            idle_timeout=http.get_duration("idleTimeout", positive=True),
            h2_upgrade=upgrade == "UPGRADE",
        )
        http.finish()
    f.finish()
    return pool


def _outlier(f: Fields | None) -> OutlierDetection | None:
    if f is None:
        return None
    legacy = f.get_int("consecutiveErrors")
    five = f.get_int("consecutive5xxErrors")
    result = OutlierDetection(
        # The deprecated consecutiveErrors meant gateway errors (502, 503, 504).
        consecutive_5xx=five,
        consecutive_gateway=f.get_int("consecutiveGatewayErrors") or legacy,
        interval=f.get_duration("interval", positive=True),
        base_ejection_time=f.get_duration("baseEjectionTime", positive=True),
        max_ejection_percent=f.get_int("maxEjectionPercent", maximum=100),
        min_health_percent=f.get_int("minHealthPercent", maximum=100) or 0,
    )
    f.finish()
    return result


def _tls(f: Fields | None) -> ClientTls | None:
    if f is None:
        return None
    mode = TlsMode(f.get_enum("mode", _TLS_MODES, default="DISABLE"))
    credential = f.get_str("credentialName")
    if credential and (problem := formats.dns1123_subdomain(credential)):
        f.fail("credentialName", problem)
    tls = ClientTls(
        mode=mode,
        client_certificate=f.get_str("clientCertificate"),
        private_key=f.get_str("privateKey"),
        ca_certificates=f.get_str("caCertificates"),
        subject_alt_names=tuple(v for _, v in f.get_strs("subjectAltNames")),
        sni=f.get_str("sni"),
        insecure_skip_verify=f.get_bool("insecureSkipVerify"),
        credential_name=credential,
    )
    files = bool(tls.client_certificate and tls.private_key)
    if mode is TlsMode.MUTUAL and not (files or credential):
        f.fail("mode", "MUTUAL needs clientCertificate and privateKey, or credentialName")
    f.finish()
    return tls
