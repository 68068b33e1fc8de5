"""VirtualService HTTP routes -> Envoy routes (pure: a RouteSpec in, Envoy Routes out).

One Istio route with several matches becomes one Envoy route per match, in order, all with the
same action (Istio's translation); a route without matches catches everything.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from envoy.config.core.v3.base_pb2 import (
    DataSource,
    HeaderValue,
    HeaderValueOption,
    RuntimeFractionalPercent,
)
from envoy.config.route.v3.route_components_pb2 import (
    DirectResponseAction,
    HeaderMatcher,
    QueryParameterMatcher,
    RedirectAction,
    RetryPolicy,
    Route,
    RouteAction,
    RouteMatch,
)
from envoy.config.route.v3.route_components_pb2 import (
    WeightedCluster as EnvoyWeightedCluster,
)
from envoy.extensions.filters.common.fault.v3.fault_pb2 import FaultDelay
from envoy.extensions.filters.http.cors.v3.cors_pb2 import Cors
from envoy.extensions.filters.http.cors.v3.cors_pb2 import CorsPolicy as EnvoyCorsPolicy
from envoy.extensions.filters.http.fault.v3.fault_pb2 import FaultAbort, HTTPFault
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
    HttpFilter,
)
from envoy.extensions.retry.host.previous_hosts.v3.previous_hosts_pb2 import (
    PreviousHostsPredicate,
)
from envoy.type.matcher.v3.regex_pb2 import RegexMatchAndSubstitute, RegexMatcher
from envoy.type.matcher.v3.string_pb2 import StringMatcher
from envoy.type.v3.percent_pb2 import FractionalPercent
from google.protobuf.duration_pb2 import Duration
from google.protobuf.wrappers_pb2 import BoolValue, UInt32Value

from control.generate.destination_policy import hash_policies
from control.generate.wire import pack
from control.model.traffic import (
    NO_HEADERS,
    ConsistentHash,
    CorsPolicy,
    Fault,
    HeaderOps,
    HttpMatch,
    HttpRoute,
    MatchKind,
    Retries,
    StringMatch,
)

FAULT_FILTER: Final = "envoy.filters.http.fault"
CORS_FILTER: Final = "envoy.filters.http.cors"
DEFAULT_ROUTE: Final = HttpRoute(name="default")
# Istio's retryOn when a VirtualService sets attempts without retryOn.
DEFAULT_RETRY_ON: Final = "connect-failure,refused-stream,unavailable,cancelled,503"
_REDIRECT_CODES: Final = {
    301: RedirectAction.MOVED_PERMANENTLY,
    302: RedirectAction.FOUND,
    303: RedirectAction.SEE_OTHER,
    307: RedirectAction.TEMPORARY_REDIRECT,
    308: RedirectAction.PERMANENT_REDIRECT,
}


@dataclass(frozen=True, slots=True)
class WeightedCluster:
    cluster: str
    weight: int = 0
    headers: HeaderOps = NO_HEADERS


@dataclass(frozen=True, slots=True)
class RouteSpec:
    """One Istio HTTP route resolved for one listener port: its matches for that port, its
    destinations as cluster names, the consistent hash of the first destination's rule."""

    route: HttpRoute
    matches: tuple[HttpMatch, ...]
    targets: tuple[WeightedCluster, ...]
    hashed: ConsistentHash | None = None
    mirror_cluster: str = ""


def add_route_filters(hcm: HttpConnectionManager) -> None:
    """Put the HTTP filters that VirtualService routes configure per route
    (`typed_per_filter_config`) in front of the router, in Istio's order: CORS, then fault
    injection. Every HCM whose routes come from VirtualServices needs them; without a filter
    in the chain, Envoy never applies its per-route config."""
    router = len(hcm.http_filters) - 1
    for f in reversed(_ROUTE_FILTERS):
        hcm.http_filters.insert(router, f)  # a copy: the chain owns its messages


_ROUTE_FILTERS: Final = (
    HttpFilter(name=CORS_FILTER, typed_config=pack(Cors())),
    HttpFilter(name=FAULT_FILTER, typed_config=pack(HTTPFault())),
)


def build_route(spec: RouteSpec) -> list[Route]:
    action = _action(spec)
    out = []
    for match in spec.matches or (None,):
        route = Route(
            name=(match.name if match is not None and match.name else spec.route.name),
            match=_match(match),
        )
        if match is not None and match.stat_prefix:
            route.stat_prefix = match.stat_prefix
        if isinstance(action, RedirectAction):
            route.redirect.CopyFrom(action)
        elif isinstance(action, DirectResponseAction):
            route.direct_response.CopyFrom(action)
        else:
            route.route.CopyFrom(action)
        _headers(route, spec.route.headers)
        if len(spec.targets) == 1:
            # One destination: its header operations are the route's (Istio merges them).
            _headers(route, spec.targets[0].headers)
        if spec.route.fault is not None:
            route.typed_per_filter_config[FAULT_FILTER].CopyFrom(pack(_fault(spec.route.fault)))
        if spec.route.cors is not None:
            route.typed_per_filter_config[CORS_FILTER].CopyFrom(pack(_cors(spec.route.cors)))
        out.append(route)
    return out


# --- match -----------------------------------------------------------------------------------


def _string_matcher(sm: StringMatch, ignore_case: bool = False) -> StringMatcher:
    if sm.kind is MatchKind.EXACT:
        return StringMatcher(exact=sm.value, ignore_case=ignore_case)
    if sm.kind is MatchKind.PREFIX:
        return StringMatcher(prefix=sm.value, ignore_case=ignore_case)
    return StringMatcher(safe_regex=RegexMatcher(regex=sm.value))


def _header(name: str, sm: StringMatch | None, invert: bool = False) -> HeaderMatcher:
    if sm is None:
        return HeaderMatcher(name=name, present_match=True, invert_match=invert)
    return HeaderMatcher(name=name, string_match=_string_matcher(sm), invert_match=invert)


def _match(match: HttpMatch | None) -> RouteMatch:
    if match is None:
        return RouteMatch(prefix="/")
    out = RouteMatch()
    uri = match.uri
    if uri is None:
        out.prefix = "/"
    elif uri.kind is MatchKind.EXACT:
        out.path = uri.value
    elif uri.kind is MatchKind.PREFIX:
        out.prefix = uri.value
    else:
        out.safe_regex.CopyFrom(RegexMatcher(regex=uri.value))
    if match.ignore_uri_case:
        out.case_sensitive.CopyFrom(BoolValue(value=False))
    if match.method is not None:
        out.headers.append(_header(":method", match.method))
    if match.authority is not None:
        out.headers.append(_header(":authority", match.authority))
    if match.scheme is not None:
        out.headers.append(_header(":scheme", match.scheme))
    for header in match.headers:
        out.headers.append(_header(header.name, header.match, header.invert))
    for name, sm in match.query_params:
        out.query_parameters.append(
            QueryParameterMatcher(name=name, string_match=_string_matcher(sm))
        )
    return out


def _cors(policy: CorsPolicy) -> EnvoyCorsPolicy:
    """Istio's translation: lists joined with commas, the max age in whole seconds, and the
    filter on for every request of the route (Envoy's default when nothing says otherwise)."""
    out = EnvoyCorsPolicy(
        allow_origin_string_match=[_string_matcher(sm) for sm in policy.allow_origins],
        allow_methods=",".join(policy.allow_methods),
        allow_headers=",".join(policy.allow_headers),
        expose_headers=",".join(policy.expose_headers),
        forward_not_matching_preflights=BoolValue(value=policy.forward_unmatched_preflights),
    )
    if policy.max_age is not None:
        out.max_age = str(policy.max_age)
    if policy.allow_credentials is not None:
        out.allow_credentials.CopyFrom(BoolValue(value=policy.allow_credentials))
    return out


# --- action ----------------------------------------------------------------------------------


def _duration(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(round(seconds * 1e9))
    return d


def _fraction(percent: float) -> FractionalPercent:
    return FractionalPercent(
        numerator=round(percent * 10_000), denominator=FractionalPercent.MILLION
    )


def _action(spec: RouteSpec) -> RouteAction | RedirectAction | DirectResponseAction:
    route = spec.route
    if route.direct_response is not None:
        direct = DirectResponseAction(status=route.direct_response.status)
        body = route.direct_response.body
        if isinstance(body, str):
            direct.body.CopyFrom(DataSource(inline_string=body))
        elif body is not None:
            direct.body.CopyFrom(DataSource(inline_bytes=body))
        return direct
    if route.redirect is not None:
        r = route.redirect
        redirect = RedirectAction(
            response_code=_REDIRECT_CODES.get(r.code, RedirectAction.MOVED_PERMANENTLY)
        )
        if r.uri:
            redirect.path_redirect = r.uri
        if r.authority:
            redirect.host_redirect = r.authority
        if r.port:
            redirect.port_redirect = r.port
        if r.scheme:
            redirect.scheme_redirect = r.scheme
        return redirect
    # 0s disables Envoy's 15s default route timeout, as Istio does: streaming and long-poll
    # calls must not be cut by the mesh unless a VirtualService says so.
    action = RouteAction(timeout=_duration(route.timeout or 0.0))
    if len(spec.targets) == 1:
        action.cluster = spec.targets[0].cluster
    else:
        weighted = EnvoyWeightedCluster()
        for target in spec.targets:
            wc = EnvoyWeightedCluster.ClusterWeight(
                name=target.cluster, weight=UInt32Value(value=target.weight)
            )
            _headers(wc, target.headers)
            weighted.clusters.append(wc)
        action.weighted_clusters.CopyFrom(weighted)
    if route.retries is not None:
        policy = _retry_policy(route.retries)
        if policy is not None:
            action.retry_policy.CopyFrom(policy)
    if route.rewrite is not None:
        rw = route.rewrite
        if rw.uri:
            action.prefix_rewrite = rw.uri
        if rw.uri_regex is not None:
            action.regex_rewrite.CopyFrom(
                RegexMatchAndSubstitute(
                    pattern=RegexMatcher(regex=rw.uri_regex[0]), substitution=rw.uri_regex[1]
                )
            )
        if rw.authority:
            action.host_rewrite_literal = rw.authority
    if spec.mirror_cluster:
        action.request_mirror_policies.append(
            RouteAction.RequestMirrorPolicy(
                cluster=spec.mirror_cluster,
                runtime_fraction=RuntimeFractionalPercent(
                    default_value=_fraction(route.mirror_percent)
                ),
            )
        )
    action.hash_policy.extend(hash_policies(spec.hashed))
    return action


def _retry_policy(retries: Retries) -> RetryPolicy | None:
    if retries.attempts <= 0:
        return None  # attempts: 0 turns retries off
    tokens = [t.strip() for t in (retries.retry_on or DEFAULT_RETRY_ON).split(",") if t.strip()]
    codes = [int(t) for t in tokens if t.isdigit()]
    conditions = [t for t in tokens if not t.isdigit()]
    if codes and "retriable-status-codes" not in conditions:
        conditions.append("retriable-status-codes")
    policy = RetryPolicy(
        retry_on=",".join(conditions),
        num_retries=UInt32Value(value=retries.attempts),
        retriable_status_codes=codes,
        # As Istio: a retry goes to another host when there is one.
        retry_host_predicate=[
            RetryPolicy.RetryHostPredicate(
                name="envoy.retry_host_predicates.previous_hosts",
                typed_config=pack(PreviousHostsPredicate()),
            )
        ],
        host_selection_retry_max_attempts=5,
    )
    if retries.per_try_timeout is not None:
        policy.per_try_timeout.CopyFrom(_duration(retries.per_try_timeout))
    return policy


def _fault(fault: Fault) -> HTTPFault:
    out = HTTPFault()
    if fault.delay is not None:
        out.delay.CopyFrom(
            FaultDelay(
                fixed_delay=_duration(fault.delay), percentage=_fraction(fault.delay_percent)
            )
        )
    if fault.abort_status is not None:
        out.abort.CopyFrom(
            FaultAbort(http_status=fault.abort_status, percentage=_fraction(fault.abort_percent))
        )
    return out


def _headers(target: Route | EnvoyWeightedCluster.ClusterWeight, ops: HeaderOps) -> None:
    if not ops:
        return
    target.request_headers_to_add.extend(_header_options(ops.request_set, ops.request_add))
    target.request_headers_to_remove.extend(ops.request_remove)
    target.response_headers_to_add.extend(_header_options(ops.response_set, ops.response_add))
    target.response_headers_to_remove.extend(ops.response_remove)


def _header_options(
    overwrite: Iterable[tuple[str, str]], append: Iterable[tuple[str, str]]
) -> list[HeaderValueOption]:
    """Istio's `set` replaces a header's value, its `add` appends one."""
    return [
        HeaderValueOption(header=HeaderValue(key=k, value=v), append_action=action)
        for pairs, action in (
            (overwrite, HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD),
            (append, HeaderValueOption.APPEND_IF_EXISTS_OR_ADD),
        )
        for k, v in pairs
    ]
