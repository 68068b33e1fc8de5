"""AuthorizationPolicy -> Envoy RBAC filters for one inbound port.

Istio's evaluation order, as separate filters: DENY policies first (any match refuses the
request), then ALLOW policies (when any applies, a request must match one of them). No ALLOW
policy means no ALLOW filter (everything allowed); ALLOW policies without any rule that can
match make an ALLOW filter with no policies, which refuses everything.

Each Istio rule becomes one Envoy policy named `ns[NS]-policy[NAME]-rule[I]`: its `from`
entries are the policy's principals (ORed), each an AND of its fields; its `to` entries the
permissions, likewise. Identities are the peer certificate's URI SAN
(`authenticated.principal_name`), so a plaintext caller has none and matches no principal.

TCP ports get the network RBAC filter, where paths and methods do not exist. As in Istio an
operation that needs them never matches in an ALLOW rule (a rule left with no operation is
dropped), and in a DENY rule they are removed, so the rule denies more rather than less.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Final, TypeVar

from envoy.config.rbac.v3.rbac_pb2 import RBAC, Permission, Policy, Principal
from envoy.config.route.v3.route_components_pb2 import HeaderMatcher
from envoy.extensions.filters.http.rbac.v3.rbac_pb2 import RBAC as HttpRBAC
from envoy.extensions.filters.network.rbac.v3.rbac_pb2 import RBAC as NetworkRBAC
from envoy.type.matcher.v3.path_pb2 import PathMatcher
from envoy.type.matcher.v3.regex_pb2 import RegexMatcher
from envoy.type.matcher.v3.string_pb2 import StringMatcher

from control.model.types import (
    AuthorizationPolicy,
    AuthzAction,
    AuthzOperation,
    AuthzRule,
    AuthzSource,
)

HTTP_RBAC_FILTER: Final = "envoy.filters.http.rbac"
NETWORK_RBAC_FILTER: Final = "envoy.filters.network.rbac"

_ACTIONS: Final = {AuthzAction.ALLOW: RBAC.ALLOW, AuthzAction.DENY: RBAC.DENY}
_SEGMENT: Final = "[^/]+"

_V = TypeVar("_V")
_M = TypeVar("_M", Permission, Principal)


def rbac_configs(
    policies: tuple[AuthorizationPolicy, ...], *, http: bool
) -> list[tuple[AuthzAction, RBAC]]:
    """The RBAC rule sets to install, in evaluation order (DENY, then ALLOW)."""
    out: list[tuple[AuthzAction, RBAC]] = []
    for action in (AuthzAction.DENY, AuthzAction.ALLOW):
        applying = [p for p in policies if p.action is action]
        if not applying:
            continue
        rules = RBAC(action=_ACTIONS[action])
        for policy in applying:
            for i, rule in enumerate(policy.rules):
                compiled = _policy(rule, action, http=http)
                if compiled is not None:
                    rules.policies[
                        f"ns[{policy.namespace}]-policy[{policy.name}]-rule[{i}]"
                    ].CopyFrom(compiled)
        if action is AuthzAction.DENY and not rules.policies:
            continue  # denies nothing
        out.append((action, rules))
    return out


def http_filters(policies: tuple[AuthorizationPolicy, ...]) -> list[tuple[str, HttpRBAC]]:
    return [(HTTP_RBAC_FILTER, HttpRBAC(rules=r)) for _, r in rbac_configs(policies, http=True)]


def network_filters(
    policies: tuple[AuthorizationPolicy, ...], stat_prefix: str
) -> list[tuple[str, NetworkRBAC]]:
    return [
        (NETWORK_RBAC_FILTER, NetworkRBAC(rules=r, stat_prefix=f"{stat_prefix}.{a.value.lower()}"))
        for a, r in rbac_configs(policies, http=False)
    ]


# --- one rule --------------------------------------------------------------------------------


def _policy(rule: AuthzRule, action: AuthzAction, *, http: bool) -> Policy | None:
    allow = action is AuthzAction.ALLOW
    if rule.unsupported and allow:
        return None  # it had conditions we cannot check: never grant on it
    operations = list(rule.operations)
    if not http:
        if allow:
            operations = [op for op in operations if not op.http_only]
            if rule.operations and not operations:
                return None
        else:
            operations = [
                AuthzOperation(ports=op.ports, not_ports=op.not_ports) for op in operations
            ]
    permissions = [_operation(op) for op in operations] or [Permission(any=True)]
    principals = [_source(src) for src in rule.sources] or [Principal(any=True)]
    return Policy(permissions=permissions, principals=principals)


def _operation(op: AuthzOperation) -> Permission:
    fields = [
        *_field(op.paths, op.not_paths, _path, _any_of, _not_rule),
        *_field(op.methods, op.not_methods, _method, _any_of, _not_rule),
        *_field(op.ports, op.not_ports, _port, _any_of, _not_rule),
    ]
    if not fields:
        return Permission(any=True)
    return fields[0] if len(fields) == 1 else Permission(and_rules=Permission.Set(rules=fields))


def _source(src: AuthzSource) -> Principal:
    ids = [
        *_field(src.principals, src.not_principals, _principal, _any_id, _not_id),
        *_field(src.namespaces, src.not_namespaces, _namespace, _any_id, _not_id),
    ]
    if not ids:
        return Principal(any=True)
    return ids[0] if len(ids) == 1 else Principal(and_ids=Principal.Set(ids=ids))


def _field(
    values: Sequence[_V],
    excluded: Sequence[_V],
    match: Callable[[_V], _M],
    any_of: Callable[[list[_M]], _M],
    negate: Callable[[_M], _M],
) -> list[_M]:
    """One field of a rule's `to` or `from` entry: any of its values matches, and none of its
    `not` values may (each an empty list when the entry leaves it out)."""
    out = [any_of([match(v) for v in values])] if values else []
    if excluded:
        out.append(negate(any_of([match(v) for v in excluded])))
    return out


def _not_rule(rule: Permission) -> Permission:
    return Permission(not_rule=rule)


def _not_id(principal: Principal) -> Principal:
    return Principal(not_id=principal)


def _port(port: int) -> Permission:
    return Permission(destination_port=port)


def _any_of(rules: list[Permission]) -> Permission:
    return rules[0] if len(rules) == 1 else Permission(or_rules=Permission.Set(rules=rules))


def _any_id(ids: list[Principal]) -> Principal:
    return ids[0] if len(ids) == 1 else Principal(or_ids=Principal.Set(ids=ids))


# --- values, with Istio's wildcards ("*", "prefix*", "*suffix") ------------------------------


def _string(value: str, prefix: str = "") -> StringMatcher | None:
    """Exact, prefix or suffix match; None for "*" (anything)."""
    if value == "*":
        return None
    if value.endswith("*"):
        return StringMatcher(prefix=prefix + value[:-1])
    if value.startswith("*"):
        return StringMatcher(suffix=value[1:])
    return StringMatcher(exact=prefix + value)


def _path(value: str) -> Permission:
    matcher = _string(value)
    if matcher is None:
        return Permission(any=True)
    return Permission(url_path=PathMatcher(path=matcher))


def _method(value: str) -> Permission:
    matcher = _string(value)
    if matcher is None:
        return Permission(any=True)
    return Permission(header=HeaderMatcher(name=":method", string_match=matcher))


def _principal(value: str) -> Principal:
    """Istio writes principals without the scheme (`cluster.local/ns/NS/sa/SA`); `*` means
    any authenticated peer (a plaintext peer has no principal)."""
    matcher = _string(value, prefix="spiffe://") or _regex(".+")
    return Principal(authenticated=Principal.Authenticated(principal_name=matcher))


def _namespace(value: str) -> Principal:
    """A namespace is the `/ns/NS/` segment of the peer's SPIFFE ID."""
    if value == "*":
        ns = _SEGMENT
    elif value.endswith("*"):
        ns = re.escape(value[:-1]) + "[^/]*"
    elif value.startswith("*"):
        ns = "[^/]*" + re.escape(value[1:])
    else:
        ns = re.escape(value)
    matcher = _regex(f"spiffe://{_SEGMENT}/ns/{ns}/sa/{_SEGMENT}")
    return Principal(authenticated=Principal.Authenticated(principal_name=matcher))


def _regex(pattern: str) -> StringMatcher:
    return StringMatcher(safe_regex=RegexMatcher(regex=pattern))
