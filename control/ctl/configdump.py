"""`pilotfish-ctl proxy-config`: what a proxy holds, as readable tables.

Two sources, one shape. Envoy's admin `/config_dump` (what Envoy actually accepted; proto
field names, snake_case) and the control plane's `/debug/config_dump?proxyID=` (what it
generates for that proxy; JSON mapping, camelCase) are both reduced to a list of resource
dicts per kind; `_get` reads a field under either spelling. Everything here is sans-IO except
`fetch_json`.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import aiohttp
from cryptography import x509

KINDS = ("clusters", "listeners", "routes", "endpoints", "secret")

# Envoy admin: kind -> (config dump type suffix, [(list field, path to the resource)]).
_ENVOY: dict[str, tuple[str, tuple[tuple[str, tuple[str, ...]], ...]]] = {
    "clusters": (
        "ClustersConfigDump",
        (("static_clusters", ("cluster",)), ("dynamic_active_clusters", ("cluster",))),
    ),
    "listeners": (
        "ListenersConfigDump",
        (("static_listeners", ("listener",)), ("dynamic_listeners", ("active_state", "listener"))),
    ),
    "routes": (
        "RoutesConfigDump",
        (
            ("static_route_configs", ("route_config",)),
            ("dynamic_route_configs", ("route_config",)),
        ),
    ),
    "endpoints": (
        "EndpointsConfigDump",
        (
            ("static_endpoint_configs", ("endpoint_config",)),
            ("dynamic_endpoint_configs", ("endpoint_config",)),
        ),
    ),
    "secret": (
        "SecretsConfigDump",
        (("static_secrets", ("secret",)), ("dynamic_active_secrets", ("secret",))),
    ),
}

# The control plane's dump: kind -> short type name.
_CONTROL = {"clusters": "CDS", "listeners": "LDS", "routes": "RDS", "endpoints": "EDS"}


class DumpError(Exception):
    """The dump could not be fetched or does not hold what was asked for."""


async def fetch_json(url: str, timeout: float = 5.0, token: str = "") -> Any:
    """GET `url` as JSON; `token` is sent as `Authorization: Bearer` (the control plane's
    /debug/* off loopback needs one of an identity in its --debug-allow)."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.get(url, headers=headers) as r,
        ):
            text = await r.text()
            if r.status != 200:
                detail = text.strip().splitlines()[0] if text.strip() else r.reason
                raise DumpError(f"{url}: HTTP {r.status}: {detail}")
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        raise DumpError(f"{url}: {e or type(e).__name__}") from None
    try:
        return json.loads(text)
    except ValueError:
        raise DumpError(f"{url}: the answer is not JSON") from None


def envoy_resources(dump: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    """The resources of `kind` in an Envoy admin config dump."""
    suffix, fields = _ENVOY[kind]
    out: list[dict[str, Any]] = []
    for config in dump.get("configs", ()):
        if not str(config.get("@type", "")).endswith(suffix):
            continue
        for list_field, path in fields:
            for item in config.get(list_field, ()):
                resource: Any = item
                for step in path:
                    resource = resource.get(step) if isinstance(resource, Mapping) else None
                if isinstance(resource, Mapping):
                    out.append(dict(resource))
    return out


def control_resources(dump: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    """The resources of `kind` in the control plane's /debug/config_dump answer."""
    if kind not in _CONTROL:
        raise DumpError(
            f"the control plane does not hold {kind!r}: secrets come from the agent; "
            "give the pod IP to read them from its Envoy"
        )
    rows = dump.get("resources", {}).get(_CONTROL[kind], ())
    return [dict(r["resource"]) for r in rows if isinstance(r.get("resource"), Mapping)]


# --- tables ---------------------------------------------------------------------------------


def table(kind: str, resources: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    return _TABLES[kind](resources)


def _get(d: Any, snake: str, default: Any = None) -> Any:
    """A field under its proto name or its JSON (lowerCamel) name."""
    if not isinstance(d, Mapping):
        return default
    if snake in d:
        return d[snake]
    head, *rest = snake.split("_")
    camel = head + "".join(p.title() for p in rest)
    return d.get(camel, default)


def _clusters(resources: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    rows = []
    for c in resources:
        name = str(_get(c, "name", ""))
        ctype = str(_get(c, "type", "") or ("EDS" if _get(c, "eds_cluster_config") else "STATIC"))
        parts = name.split("|")
        if len(parts) == 4 and parts[0] in ("outbound", "inbound"):
            direction, port, subset, fqdn = parts
            rows.append([fqdn or "-", port, subset or "-", direction, ctype])
        else:
            rows.append([name, "-", "-", "-", ctype])
    rows.sort(key=lambda r: (r[0], r[1], r[2], r[3]))
    return ["SERVICE FQDN", "PORT", "SUBSET", "DIRECTION", "TYPE"], rows


def _address(addr: Any) -> tuple[str, str]:
    sock = _get(addr, "socket_address")
    if sock:
        return str(_get(sock, "address", "")), str(_get(sock, "port_value", 0))
    pipe = _get(addr, "pipe")
    if pipe:
        return "unix:" + str(_get(pipe, "path", "")), "-"
    return "-", "-"


def _chain_match(chain: Mapping[str, Any]) -> str:
    m = _get(chain, "filter_chain_match") or {}
    parts = []
    if _get(m, "destination_port"):
        parts.append(f"port {_get(m, 'destination_port')}")
    if _get(m, "transport_protocol"):
        parts.append(str(_get(m, "transport_protocol")))
    if _get(m, "application_protocols"):
        parts.append("alpn " + ",".join(_get(m, "application_protocols")))
    if _get(m, "server_names"):
        parts.append("sni " + ",".join(_get(m, "server_names")))
    return "; ".join(parts) or "ALL"


def _chain_destination(chain: Mapping[str, Any]) -> str:
    for f in _get(chain, "filters", ()) or ():
        cfg = _get(f, "typed_config") or {}
        kind = str(cfg.get("@type", ""))
        if kind.endswith("HttpConnectionManager"):
            rds = _get(cfg, "rds")
            if rds:
                return f"Route: {_get(rds, 'route_config_name', '')}"
            inline = _get(cfg, "route_config")
            if inline is not None:
                return f"Inline route: {_get(inline, 'name', '') or '-'}"
            return "HTTP"
        if kind.endswith("TcpProxy"):
            cluster = _get(cfg, "cluster")
            if cluster:
                return f"Cluster: {cluster}"
            weighted = _get(_get(cfg, "weighted_clusters"), "clusters", ()) or ()
            return "Clusters: " + ",".join(str(_get(w, "name", "")) for w in weighted)
    return "-"


def _listeners(resources: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    rows = []
    for lst in resources:
        address, port = _address(_get(lst, "address"))
        chains = list(_get(lst, "filter_chains", ()) or ())
        default = _get(lst, "default_filter_chain")
        if default:
            chains.append({**default, "filter_chain_match": {}})
        if not chains:
            rows.append([address, port, "-", "-"])
        for chain in chains:
            rows.append([address, port, _chain_match(chain), _chain_destination(chain)])
    rows.sort(key=lambda r: (r[0], int(r[1]) if r[1].isdigit() else 0, r[2]))
    return ["ADDRESS", "PORT", "MATCH", "DESTINATION"], rows


def _domains(domains: Iterable[str]) -> str:
    ds = list(domains)
    if len(ds) <= 2:
        return ",".join(ds) or "*"
    return f"{ds[0]},{ds[1]} +{len(ds) - 2} more"


def _route_match(match: Any) -> str:
    for key, fmt in (("prefix", "{}*"), ("path", "{}"), ("path_separated_prefix", "{}/*")):
        value = _get(match, key)
        if value is not None:
            return fmt.format(value) if value or key != "prefix" else "/*"
    regex = _get(_get(match, "safe_regex"), "regex")
    if regex is not None:
        return f"~{regex}"
    return "*"


def _route_target(route: Mapping[str, Any]) -> str:
    action = _get(route, "route")
    if action is not None:
        if _get(action, "cluster"):
            return str(_get(action, "cluster"))
        weighted = _get(_get(action, "weighted_clusters"), "clusters", ()) or ()
        if weighted:
            return ",".join(f"{_get(w, 'name', '')}:{_get(w, 'weight', 0)}" for w in weighted)
        if _get(action, "cluster_header"):
            return f"header {_get(action, 'cluster_header')}"
    if _get(route, "redirect") is not None:
        return "redirect"
    if _get(route, "direct_response") is not None:
        status = _get(_get(route, "direct_response"), "status", "")
        return f"direct response {status}"
    return "-"


def _routes(resources: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    rows = []
    for rc in resources:
        name = str(_get(rc, "name", "")) or "-"
        for vh in _get(rc, "virtual_hosts", ()) or ():
            vh_routes = _get(vh, "routes", ()) or ()
            domains = _domains(_get(vh, "domains", ()) or ())
            vname = str(_get(vh, "name", "")) or "-"
            if not vh_routes:
                rows.append([name, vname, domains, "-", "-"])
            for route in vh_routes:
                rows.append(
                    [name, vname, domains, _route_match(_get(route, "match")), _route_target(route)]
                )
    rows.sort(key=lambda r: (r[0], r[1]))
    return ["NAME", "VIRTUAL HOST", "DOMAINS", "MATCH", "CLUSTER"], rows


def _endpoints(resources: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    rows = []
    for cla in resources:
        cluster = str(_get(cla, "cluster_name", ""))
        for group in _get(cla, "endpoints", ()) or ():
            for lb in _get(group, "lb_endpoints", ()) or ():
                address, port = _address(_get(_get(lb, "endpoint"), "address"))
                status = str(_get(lb, "health_status", "") or "HEALTHY")
                weight = str(_get(lb, "load_balancing_weight", "") or "-")
                rows.append([f"{address}:{port}", status, weight, cluster])
    rows.sort(key=lambda r: (r[3], r[0]))
    return ["ENDPOINT", "STATUS", "WEIGHT", "CLUSTER"], rows


def _pem_certs(source: Any) -> list[x509.Certificate]:
    """Certificates from an Envoy DataSource (inline_bytes is base64 in JSON)."""
    raw: bytes = b""
    if _get(source, "inline_bytes"):
        raw = base64.b64decode(_get(source, "inline_bytes"))
    elif _get(source, "inline_string"):
        raw = str(_get(source, "inline_string")).encode()
    if not raw:
        return []
    try:
        return x509.load_pem_x509_certificates(raw)
    except ValueError:
        return []


def _secret(resources: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    now = dt.datetime.now(dt.UTC)
    rows = []
    for s in resources:
        name = str(_get(s, "name", ""))
        tls = _get(s, "tls_certificate")
        validation = _get(s, "validation_context")
        if tls is not None:
            kind, certs = "Cert Chain", _pem_certs(_get(tls, "certificate_chain"))
        elif validation is not None:
            kind, certs = "CA", _pem_certs(_get(validation, "trusted_ca"))
        else:
            kind, certs = "-", []
        if not certs:
            rows.append([name, kind, "-", "-", "-", "-"])
            continue
        leaf = certs[0]
        valid = leaf.not_valid_before_utc <= now < leaf.not_valid_after_utc
        rows.append(
            [
                name,
                kind,
                "true" if valid else "false",
                format(leaf.serial_number, "x"),
                leaf.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ"),
                leaf.not_valid_before_utc.strftime("%Y-%m-%dT%H:%M:%SZ"),
            ]
        )
    rows.sort(key=lambda r: r[0])
    return ["RESOURCE NAME", "TYPE", "VALID", "SERIAL NUMBER", "NOT AFTER", "NOT BEFORE"], rows


_TABLES = {
    "clusters": _clusters,
    "listeners": _listeners,
    "routes": _routes,
    "endpoints": _endpoints,
    "secret": _secret,
}
