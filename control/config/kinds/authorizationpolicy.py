"""Istio `AuthorizationPolicy` -> model AuthorizationPolicy (actions ALLOW and DENY).

Rule semantics as Istio's: a rule matches when any `from` matches and any `to` matches; inside
one source or operation every field set must match, and the values of a field are ORed. An
ALLOW policy without rules allows nothing; `rules: [{}]` allows everything.

Conditions we cannot enforce (`when`, `requestPrincipals`, `ipBlocks`, `hosts`, ...) are
reported, and their rule fails closed: an ALLOW rule that has one never matches, a DENY rule
is kept without it and so denies more. Nothing is half-applied in the permissive direction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from control.config import formats
from control.config.fields import Context, Fields
from control.config.kinds.common import spec_of
from control.config.kinds.security import SECURITY_VERSIONS, match_labels
from control.config.manifest import format_path
from control.config.objects import ConfigObject
from control.config.yamlsource import Path
from control.model.types import (
    AuthorizationPolicy,
    AuthzAction,
    AuthzOperation,
    AuthzRule,
    AuthzSource,
)

API_VERSIONS = SECURITY_VERSIONS

_ACTIONS = ("ALLOW", "DENY", "AUDIT", "CUSTOM")

T = TypeVar("T")


def convert(ctx: Context, domain: str) -> ConfigObject:
    obj = ctx.obj
    spec = spec_of(ctx, formats.dns1123_subdomain)
    selector = match_labels(spec)
    action = spec.get_enum("action", _ACTIONS, default="ALLOW")
    if action == "CUSTOM":
        # Dropping it would allow what the external authorizer was meant to refuse.
        spec.fail("action", "CUSTOM is not supported (there are no extension providers)")
    rules = tuple(_rule(item, action) for item in spec.get_maps("rules"))
    spec.finish()
    if action == "AUDIT":
        ctx.warn("spec.action AUDIT is not supported; this policy is ignored (it grants nothing)")
        return ConfigObject(ctx.source, obj.data)
    policy = AuthorizationPolicy(
        namespace=obj.namespace,
        name=obj.name,
        source=ctx.source,
        selector=selector,
        action=AuthzAction(action),
        rules=rules,
    )
    return ConfigObject(ctx.source, obj.data, authorization_policies=(policy,))


def _rule(rule: Fields, action: str) -> AuthzRule:
    sources, bad_from = _clauses(rule, "from", "source", _source, action)
    operations, bad_to = _clauses(rule, "to", "operation", _operation, action)
    unsupported = _unsupported(rule, action)
    return AuthzRule(tuple(sources), tuple(operations), bad_from or bad_to or unsupported)


def _clauses(
    rule: Fields, key: str, inner: str, build: Callable[[Fields], T], action: str
) -> tuple[list[T], bool]:
    """The `key` list of a rule (`from: [{source: ...}]`, `to: [{operation: ...}]`), and
    whether any of its fields is unsupported."""
    out: list[T] = []
    unsupported = False
    for item in rule.get_maps(key):
        clause = item.need_map(inner)
        out.append(build(clause))
        unsupported |= _unsupported(clause, action)
        unsupported |= _unsupported(item, action)
    return out, unsupported


def _source(source: Fields) -> AuthzSource:
    return AuthzSource(
        principals=_patterns(source, "principals"),
        not_principals=_patterns(source, "notPrincipals"),
        namespaces=_patterns(source, "namespaces"),
        not_namespaces=_patterns(source, "notNamespaces"),
    )


def _operation(operation: Fields) -> AuthzOperation:
    return AuthzOperation(
        paths=_patterns(operation, "paths"),
        not_paths=_patterns(operation, "notPaths"),
        methods=_patterns(operation, "methods"),
        not_methods=_patterns(operation, "notMethods"),
        ports=_ports(operation, "ports"),
        not_ports=_ports(operation, "notPorts"),
    )


def _unsupported(f: Fields, action: str) -> bool:
    """Report every field of `f` nobody read; True when there was one."""
    keys = f.unused()
    effect = (
        "this ALLOW rule never matches"
        if action == "ALLOW"
        else "this DENY rule applies without it (denies more)"
    )
    for key in keys:
        f.ctx.warn(f"{format_path(f.at(key))} is not supported; {effect}")
    f.ignore(*keys)
    return bool(keys)


def _patterns(f: Fields, key: str) -> tuple[str, ...]:
    """Values with Istio's wildcard: `*` alone, or at the start or the end of the value."""
    out: list[str] = []
    for path, value in f.get_strs(key):
        _check_wildcard(f, path, value)
        if value not in out:
            out.append(value)
    return tuple(out)


def _check_wildcard(f: Fields, path: Path, value: str) -> None:
    inner = value[1:-1] if len(value) > 1 else ""
    if "*" in inner or value == "**":
        f.ctx.fail(path, f"{value!r}: '*' is only allowed alone, as a prefix or as a suffix")


def _ports(f: Fields, key: str) -> tuple[int, ...]:
    """Istio writes ports as strings ("8080"); numbers are accepted too."""
    out: list[int] = []
    for path, value in f.get_list(key):
        text = str(value)
        if isinstance(value, bool) or not text.isdigit() or not 1 <= int(text) <= 65535:
            f.ctx.fail(path, f"port {text!r} must be an integer 1-65535")
        if int(text) not in out:
            out.append(int(text))
    return tuple(out)
