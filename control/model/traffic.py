"""Traffic management in the typed model: Istio `DestinationRule` and `VirtualService`.

Frozen dataclasses like the rest of the model (they are parts of cache keys). Durations are
seconds as floats, percentages floats 0-100; hosts are already resolved by the config loader
(short names expanded in the object's namespace), so generators never see a short name.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields, replace

from control.model.types import Labels, SourceRef


def exported_to(export_to: tuple[str, ...], owner_namespace: str, client_namespace: str) -> bool:
    """Istio `exportTo`: `*` everyone, `.` the object's own namespace, else namespace names."""
    for value in export_to:
        if value == "*" or value == client_namespace:
            return True
        if value == "." and client_namespace == owner_namespace:
            return True
    return False


# --- DestinationRule -------------------------------------------------------------------------


class LbPolicy(enum.StrEnum):
    ROUND_ROBIN = "ROUND_ROBIN"
    LEAST_REQUEST = "LEAST_REQUEST"
    RANDOM = "RANDOM"


@dataclass(frozen=True, slots=True)
class ConsistentHash:
    """`loadBalancer.consistentHash`: exactly one of header, cookie, source IP, query param."""

    header: str = ""
    cookie: str = ""
    cookie_path: str = ""
    cookie_ttl: float | None = None
    source_ip: bool = False
    query_param: str = ""
    minimum_ring_size: int = 0
    maglev: bool = False


@dataclass(frozen=True, slots=True)
class LocalityDistribute:
    """`distribute[]`: clients in localities matching `source` (`region/zone/subzone`, `*`
    as the last part matches anything) send these shares (percent, summing to 100) to the
    endpoints of the localities matching each destination pattern, in the order given."""

    source: str
    to: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class LocalityFailover:
    """`failover[]`: a client in region `source` falls back to region `to` before others."""

    source: str
    to: str


@dataclass(frozen=True, slots=True)
class LocalityLbSetting:
    """Istio `localityLbSetting` (DestinationRule `loadBalancer`, or the mesh default).
    `enabled` None means unset: on, unless the mesh-wide setting turns it off."""

    enabled: bool | None = None
    distribute: tuple[LocalityDistribute, ...] = ()
    failover: tuple[LocalityFailover, ...] = ()
    # Label keys, most significant first; `key=value` pins the value to compare with.
    failover_priority: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LoadBalancer:
    simple: LbPolicy | None = None
    consistent_hash: ConsistentHash | None = None
    locality: LocalityLbSetting | None = None


@dataclass(frozen=True, slots=True)
class ConnectionPool:
    max_connections: int | None = None
    connect_timeout: float | None = None
    http1_max_pending_requests: int | None = None
    http2_max_requests: int | None = None
    max_requests_per_connection: int | None = None
    max_retries: int | None = None
    idle_timeout: float | None = None
    h2_upgrade: bool = False


@dataclass(frozen=True, slots=True)
class OutlierDetection:
    consecutive_5xx: int | None = None
    consecutive_gateway: int | None = None
    interval: float | None = None
    base_ejection_time: float | None = None
    max_ejection_percent: int | None = None
    min_health_percent: int = 0


class TlsMode(enum.StrEnum):
    DISABLE = "DISABLE"
    SIMPLE = "SIMPLE"
    MUTUAL = "MUTUAL"
    ISTIO_MUTUAL = "ISTIO_MUTUAL"


@dataclass(frozen=True, slots=True)
class ClientTls:
    """`trafficPolicy.tls`: how the client side of a cluster speaks TLS. Certificate fields are
    file paths on the proxy's host, as Istio's are; `credential_name` names a Secret (client
    certificate and key, CA in `ca.crt`) that gateways use instead, as Istio's do."""

    mode: TlsMode
    client_certificate: str = ""
    private_key: str = ""
    ca_certificates: str = ""
    subject_alt_names: tuple[str, ...] = ()
    sni: str = ""
    insecure_skip_verify: bool = False
    credential_name: str = ""


@dataclass(frozen=True, slots=True)
class TrafficPolicy:
    """A DestinationRule traffic policy (top level or a subset's). `port_settings` are the
    `portLevelSettings`, sorted by port; they hold no port settings of their own."""

    load_balancer: LoadBalancer | None = None
    connection_pool: ConnectionPool | None = None
    outlier_detection: OutlierDetection | None = None
    tls: ClientTls | None = None
    port_settings: tuple[tuple[int, TrafficPolicy], ...] = ()

    def overridden_by(self, other: TrafficPolicy | None) -> TrafficPolicy:
        """This policy with every field `other` sets replaced (field by field)."""
        if other is None:
            return self
        changes = {
            f.name: getattr(other, f.name)
            for f in fields(self)
            if f.name != "port_settings" and getattr(other, f.name) is not None
        }
        return replace(self, **changes)

    def at_port(self, port: int) -> TrafficPolicy:
        """The settings for one port: the port-level entry, where it sets a field, wins."""
        base = replace(self, port_settings=())
        return base.overridden_by(dict(self.port_settings).get(port))


@dataclass(frozen=True, slots=True)
class Subset:
    name: str
    labels: Labels
    policy: TrafficPolicy | None = None


@dataclass(frozen=True, slots=True)
class DestinationRule:
    namespace: str
    name: str
    source: SourceRef = field(compare=False)
    host: str = ""  # FQDN or wildcard (`*.example.com`), resolved in the rule's namespace
    policy: TrafficPolicy | None = None
    subsets: tuple[Subset, ...] = ()
    export_to: tuple[str, ...] = ("*",)
    # `workloadSelector.matchLabels`: the rule applies only to the clients of its own
    # namespace with these labels, and before any rule without one. None: every client.
    workload_selector: Labels | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def subset(self, name: str) -> Subset | None:
        return next((s for s in self.subsets if s.name == name), None)

    def effective_policy(self, port: int, subset: str = "") -> TrafficPolicy:
        """Istio's merge: top level, its port-level entry, the subset's policy, its port-level
        entry; each layer overrides the fields it sets."""
        merged = (self.policy or TrafficPolicy()).at_port(port)
        found = self.subset(subset) if subset else None
        if found is not None and found.policy is not None:
            merged = merged.overridden_by(found.policy.at_port(port))
        return merged


# --- VirtualService --------------------------------------------------------------------------


class MatchKind(enum.StrEnum):
    EXACT = "exact"
    PREFIX = "prefix"
    REGEX = "regex"


@dataclass(frozen=True, slots=True)
class StringMatch:
    kind: MatchKind
    value: str


@dataclass(frozen=True, slots=True)
class HeaderMatch:
    name: str
    match: StringMatch | None  # None: the header must be present (any value)
    invert: bool = False  # `withoutHeaders`


@dataclass(frozen=True, slots=True)
class HttpMatch:
    """One `http[].match[]` entry: every condition must hold."""

    name: str = ""
    uri: StringMatch | None = None
    ignore_uri_case: bool = False
    method: StringMatch | None = None
    authority: StringMatch | None = None
    scheme: StringMatch | None = None
    headers: tuple[HeaderMatch, ...] = ()
    query_params: tuple[tuple[str, StringMatch], ...] = ()
    port: int | None = None
    source_namespace: str = ""
    # `sourceLabels`: the match applies only to sidecars whose workload has these labels,
    # and to routers whose pod has them (control/generate/route_tables.py `vs_routes`).
    source_labels: Labels = ()
    # `statPrefix`: Envoy emits this route's own statistics under it (none when empty).
    stat_prefix: str = ""
    # `match[].gateways`: when set, this match applies only to these (resolved `ns/name` refs,
    # or `mesh`) instead of the VirtualService's `gateways`.
    gateways: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class HeaderOps:
    """`headers.request` / `headers.response`: set, add, remove."""

    request_set: tuple[tuple[str, str], ...] = ()
    request_add: tuple[tuple[str, str], ...] = ()
    request_remove: tuple[str, ...] = ()
    response_set: tuple[tuple[str, str], ...] = ()
    response_add: tuple[tuple[str, str], ...] = ()
    response_remove: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self))


NO_HEADERS = HeaderOps()


@dataclass(frozen=True, slots=True)
class Destination:
    host: str  # resolved FQDN
    subset: str = ""
    port: int | None = None
    weight: int = 0
    headers: HeaderOps = NO_HEADERS


@dataclass(frozen=True, slots=True)
class Retries:
    attempts: int
    per_try_timeout: float | None = None
    retry_on: str = ""


@dataclass(frozen=True, slots=True)
class Fault:
    delay: float | None = None
    delay_percent: float = 100.0
    abort_status: int | None = None
    abort_percent: float = 100.0


@dataclass(frozen=True, slots=True)
class Redirect:
    uri: str = ""
    authority: str = ""
    port: int | None = None
    scheme: str = ""
    code: int = 301


# The largest `directResponse` body, Istio's: Envoy's own default (`max_direct_response_body_
# size_bytes`, 4 KB) would reject a whole route configuration holding a larger one, so every
# route configuration sets it to this (control/generate/filters.py `direct_body_limit`).
MAX_DIRECT_RESPONSE_BODY = 1 << 20


@dataclass(frozen=True, slots=True)
class DirectResponse:
    """`directResponse`: Envoy answers with this status and body itself (no upstream)."""

    status: int
    body: str | bytes | None = None  # `body.string`, or `body.bytes` (base64 in the YAML)


@dataclass(frozen=True, slots=True)
class CorsPolicy:
    """`corsPolicy`: what Envoy's CORS filter answers for this route's cross-origin requests."""

    allow_origins: tuple[StringMatch, ...] = ()  # `allowOrigins`, or the legacy `allowOrigin`
    allow_methods: tuple[str, ...] = ()
    allow_headers: tuple[str, ...] = ()
    expose_headers: tuple[str, ...] = ()
    max_age: int | None = None  # whole seconds
    allow_credentials: bool | None = None  # None: not said (Envoy sends no header)
    # `unmatchedPreflights`: FORWARD (Istio's default) passes a preflight whose origin matches
    # nothing on to the app; IGNORE answers it without CORS headers.
    forward_unmatched_preflights: bool = True


@dataclass(frozen=True, slots=True)
class Rewrite:
    uri: str = ""
    authority: str = ""
    uri_regex: tuple[str, str] | None = None  # (pattern, substitution)


@dataclass(frozen=True, slots=True)
class Delegate:
    """`http[].delegate`: the VirtualService (without hosts) whose routes replace this one."""

    name: str
    namespace: str  # the root VirtualService's when not given

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class HttpRoute:
    name: str = ""
    matches: tuple[HttpMatch, ...] = ()  # empty: matches every request
    destinations: tuple[Destination, ...] = ()
    redirect: Redirect | None = None
    direct_response: DirectResponse | None = None
    cors: CorsPolicy | None = None
    rewrite: Rewrite | None = None
    timeout: float | None = None
    retries: Retries | None = None
    fault: Fault | None = None
    mirror: Destination | None = None
    mirror_percent: float = 100.0
    headers: HeaderOps = NO_HEADERS
    # Set on a root VirtualService's route as written; config merge replaces the route with
    # the delegate's routes (control/model/delegation.py), so generators never see one.
    delegate: Delegate | None = None


@dataclass(frozen=True, slots=True)
class TcpRoute:
    ports: tuple[int, ...] = ()  # from `match[].port`; empty: every port
    destinations: tuple[Destination, ...] = ()
    # From `match[].gateways`: restricts the route to these gateways (empty: the VS's).
    gateways: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TlsRoute:
    """`tls[]`: TLS passthrough routed by SNI (`match[].sniHosts`, required by Istio)."""

    sni_hosts: tuple[str, ...] = ()
    ports: tuple[int, ...] = ()
    destinations: tuple[Destination, ...] = ()
    gateways: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class VirtualService:
    namespace: str
    name: str
    source: SourceRef = field(compare=False)
    # Resolved FQDNs or wildcards; none for a delegate, which applies only through the
    # routes of root VirtualServices that delegate to it.
    hosts: tuple[str, ...] = ()
    http: tuple[HttpRoute, ...] = ()
    tcp: tuple[TcpRoute, ...] = ()
    tls: tuple[TlsRoute, ...] = ()
    export_to: tuple[str, ...] = ("*",)
    # `gateways`, resolved: `mesh` for sidecars and `namespace/name` for Gateways. A
    # VirtualService without `gateways` applies to sidecars only (`("mesh",)`), as in Istio.
    gateways: tuple[str, ...] = ("mesh",)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


def bound_to(vs: VirtualService, gateway: str) -> VirtualService | None:
    """The part of `vs` that applies to `gateway` (`mesh`, or a resolved `ns/name`), as Istio
    selects it: the VirtualService must name the gateway in `gateways`; a match (or TCP/TLS
    route) naming gateways of its own applies only to those; a route whose every match was
    left out is left out (it must not become a catch-all). None when nothing applies. A
    VirtualService that applies unchanged is returned as is (sidecar config keyed by it stays
    shared)."""
    if gateway not in vs.gateways:
        return None
    http: list[HttpRoute] = []
    for route in vs.http:
        matches = tuple(m for m in route.matches if not m.gateways or gateway in m.gateways)
        if route.matches and not matches:
            continue
        same = len(matches) == len(route.matches)
        http.append(route if same else replace(route, matches=matches))
    tcp = tuple(r for r in vs.tcp if not r.gateways or gateway in r.gateways)
    tls = tuple(r for r in vs.tls if not r.gateways or gateway in r.gateways)
    if not (http or tcp or tls):
        return None
    if len(http) == len(vs.http) and all(a is b for a, b in zip(http, vs.http, strict=True)):
        if len(tcp) == len(vs.tcp) and len(tls) == len(vs.tls):
            return vs
    return replace(vs, http=tuple(http), tcp=tcp, tls=tls)
