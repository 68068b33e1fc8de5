"""security.istio.io kinds -> model (control/config/kinds/peerauthentication.py and
authorizationpolicy.py): valid objects, `file:line` errors, unsupported fields reported."""

from __future__ import annotations

import textwrap

import pytest

from control.config.errors import ConfigError
from control.config.loader import load_text
from control.config.merge import merge
from control.config.objects import FileConfig
from control.model.types import (
    AuthorizationPolicy,
    AuthzAction,
    AuthzOperation,
    AuthzRule,
    AuthzSource,
    MtlsMode,
    PeerAuthentication,
    SourceRef,
    labels_of,
)


def load(text: str) -> FileConfig:
    return load_text(textwrap.dedent(text).lstrip("\n"), "sec.yaml")


def error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(text)
    return info.value


def messages(fc: FileConfig) -> list[str]:
    return [w.message for w in fc.warnings]


# --- PeerAuthentication ----------------------------------------------------------------------


def test_peer_authentication_levels() -> None:
    fc = load(
        """
        apiVersion: security.istio.io/v1
        kind: PeerAuthentication
        metadata: {name: default, namespace: istio-system}
        spec:
          mtls: {mode: STRICT}
        ---
        apiVersion: security.istio.io/v1beta1
        kind: PeerAuthentication
        metadata: {name: shop, namespace: shop}
        spec: {}
        ---
        apiVersion: security.istio.io/v1
        kind: PeerAuthentication
        metadata: {name: web, namespace: shop}
        spec:
          selector:
            matchLabels: {app: web}
          mtls:
            mode: PERMISSIVE
          portLevelMtls:
            8080:
              mode: DISABLE
            "9090": {}
        """
    )
    assert fc.warnings == ()
    mesh, ns, wl = (o.peer_authentications[0] for o in fc.objects)
    assert mesh == PeerAuthentication(
        "istio-system",
        "default",
        SourceRef("PeerAuthentication", "istio-system", "default", "sec.yaml", 1),
        mode=MtlsMode.STRICT,
    )
    assert (ns.selector, ns.mode) == (None, MtlsMode.UNSET)
    assert wl.selector == labels_of({"app": "web"})
    assert wl.mode is MtlsMode.PERMISSIVE
    assert wl.port_modes == ((8080, MtlsMode.DISABLE), (9090, MtlsMode.UNSET))


@pytest.mark.parametrize(
    ("spec", "line", "reason"),
    [
        (
            "mtls: {mode: strict}",
            5,
            "spec.mtls.mode: must be one of UNSET, DISABLE, PERMISSIVE, STRICT (got 'strict')",
        ),
        (
            "portLevelMtls: {8080: {mode: DISABLE}}",
            5,
            "spec.portLevelMtls: needs a selector: port-level mTLS applies to the ports of "
            "selected workloads",
        ),
        (
            "selector: {matchLabels: {app: web}}\nportLevelMtls: {http: {mode: DISABLE}}",
            6,
            "spec.portLevelMtls.http: port 'http' must be an integer 1-65535",
        ),
        (
            "selector: {matchLabels: {app: web}}\nportLevelMtls: {80: DISABLE}",
            6,
            "spec.portLevelMtls.80: must be a mapping like {mode: DISABLE}",
        ),
        (
            "selector: {matchLabels: {}}",
            5,
            "spec.selector.matchLabels: must have at least one label (omit selector to apply "
            "to the whole namespace)",
        ),
    ],
)
def test_peer_authentication_errors(spec: str, line: int, reason: str) -> None:
    err = error(
        "apiVersion: security.istio.io/v1\n"
        "kind: PeerAuthentication\n"
        "metadata: {name: p, namespace: shop}\n"
        "spec:\n" + textwrap.indent(spec, "  ") + "\n"
    )
    assert (err.file, err.line) == ("sec.yaml", line)
    assert err.reason == f"PeerAuthentication shop/p: {reason}"


def test_peer_authentication_unsupported_fields_and_root_selector() -> None:
    fc = load(
        """
        apiVersion: security.istio.io/v1
        kind: PeerAuthentication
        metadata: {name: p, namespace: shop}
        spec:
          mtls: {mode: STRICT, extra: 1}
          targetRef: {kind: Service, name: web}
        ---
        apiVersion: security.istio.io/v1
        kind: PeerAuthentication
        metadata: {name: odd, namespace: istio-system}
        spec:
          selector: {matchLabels: {app: web}}
          mtls: {mode: DISABLE}
        """
    )
    assert messages(fc) == [
        "spec.mtls.extra is not supported; ignored",
        "spec.targetRef is not supported; ignored",
        "spec.selector in the root namespace istio-system is not supported; this policy is "
        "ignored (use a policy without selector for the whole mesh)",
    ]
    assert fc.objects[0].peer_authentications[0].mode is MtlsMode.STRICT
    assert fc.objects[1].peer_authentications == ()


# --- AuthorizationPolicy ---------------------------------------------------------------------


def test_authorization_policy_rules() -> None:
    fc = load(
        """
        apiVersion: security.istio.io/v1
        kind: AuthorizationPolicy
        metadata: {name: web, namespace: shop}
        spec:
          selector:
            matchLabels: {app: web}
          action: ALLOW
          rules:
          - from:
            - source:
                principals: ["cluster.local/ns/shop/sa/client", "*/sa/admin"]
                notNamespaces: [test]
            - source: {namespaces: ["ops-*"]}
            to:
            - operation:
                paths: ["/api/*", "/healthz"]
                methods: [GET, HEAD]
                ports: ["8080", 9090]
                notPaths: ["*.php"]
          - {}
        """
    )
    assert fc.warnings == ()
    (policy,) = fc.objects[0].authorization_policies
    assert policy == AuthorizationPolicy(
        "shop",
        "web",
        SourceRef("AuthorizationPolicy", "shop", "web"),
        selector=labels_of({"app": "web"}),
        action=AuthzAction.ALLOW,
        rules=(
            AuthzRule(
                sources=(
                    AuthzSource(
                        principals=("cluster.local/ns/shop/sa/client", "*/sa/admin"),
                        not_namespaces=("test",),
                    ),
                    AuthzSource(namespaces=("ops-*",)),
                ),
                operations=(
                    AuthzOperation(
                        paths=("/api/*", "/healthz"),
                        not_paths=("*.php",),
                        methods=("GET", "HEAD"),
                        ports=(8080, 9090),
                    ),
                ),
            ),
            AuthzRule(),  # matches everything
        ),
    )


def test_empty_policies_keep_istio_meaning() -> None:
    fc = load(
        """
        apiVersion: security.istio.io/v1
        kind: AuthorizationPolicy
        metadata: {name: allow-nothing, namespace: shop}
        spec: {}
        ---
        apiVersion: security.istio.io/v1
        kind: AuthorizationPolicy
        metadata: {name: allow-all, namespace: shop}
        spec:
          rules: [{}]
        ---
        apiVersion: security.istio.io/v1
        kind: AuthorizationPolicy
        metadata: {name: deny-nothing, namespace: shop}
        spec: {action: DENY}
        """
    )
    nothing, everything, deny = (o.authorization_policies[0] for o in fc.objects)
    assert (nothing.action, nothing.rules, nothing.selector) == (AuthzAction.ALLOW, (), None)
    assert everything.rules == (AuthzRule(),)
    assert (deny.action, deny.rules) == (AuthzAction.DENY, ())


def test_unsupported_conditions_fail_closed() -> None:
    fc = load(
        """
        apiVersion: security.istio.io/v1
        kind: AuthorizationPolicy
        metadata: {name: a, namespace: shop}
        spec:
          rules:
          - from: [{source: {ipBlocks: ["10.0.0.0/8"]}}]
          - to: [{operation: {hosts: [x.example], methods: [GET]}}]
            when: [{key: "request.auth.claims[iss]", values: [me]}]
        ---
        apiVersion: security.istio.io/v1
        kind: AuthorizationPolicy
        metadata: {name: d, namespace: shop}
        spec:
          action: DENY
          rules:
          - from: [{source: {requestPrincipals: ["*"], principals: [x]}}]
          - {}
        """
    )
    assert messages(fc) == [
        "spec.rules[0].from[0].source.ipBlocks is not supported; this ALLOW rule never matches",
        "spec.rules[1].to[0].operation.hosts is not supported; this ALLOW rule never matches",
        "spec.rules[1].when is not supported; this ALLOW rule never matches",
        "spec.rules[0].from[0].source.requestPrincipals is not supported; this DENY rule "
        "applies without it (denies more)",
    ]
    allow = fc.objects[0].authorization_policies[0]
    assert [r.unsupported for r in allow.rules] == [True, True]
    deny = fc.objects[1].authorization_policies[0]
    assert [r.unsupported for r in deny.rules] == [True, False]
    assert deny.rules[0].sources == (AuthzSource(principals=("x",)),)


def test_audit_is_ignored_with_a_warning() -> None:
    fc = load(
        """
        apiVersion: security.istio.io/v1
        kind: AuthorizationPolicy
        metadata: {name: audit, namespace: shop}
        spec: {action: AUDIT, rules: [{}]}
        """
    )
    assert fc.objects[0].authorization_policies == ()
    assert messages(fc) == [
        "spec.action AUDIT is not supported; this policy is ignored (it grants nothing)"
    ]


@pytest.mark.parametrize(
    ("spec", "line", "reason"),
    [
        (
            "action: CUSTOM",
            5,
            "spec.action: CUSTOM is not supported (there are no extension providers)",
        ),
        (
            "action: allow",
            5,
            "spec.action: must be one of ALLOW, DENY, AUDIT, CUSTOM (got 'allow')",
        ),
        (
            "rules:\n- from: [{source: {principals: ['a*b']}}]",
            6,
            "spec.rules[0].from[0].source.principals[0]: 'a*b': '*' is only allowed alone, as a "
            "prefix or as a suffix",
        ),
        (
            "rules:\n- to: [{operation: {ports: ['http']}}]",
            6,
            "spec.rules[0].to[0].operation.ports[0]: port 'http' must be an integer 1-65535",
        ),
        (
            "rules:\n- to: [{operation: {ports: [70000]}}]",
            6,
            "spec.rules[0].to[0].operation.ports[0]: port '70000' must be an integer 1-65535",
        ),
        ("rules:\n- from: [{}]", 6, "spec.rules[0].from[0].source: is required"),
        (
            "rules:\n- to: [{operation: {methods: [GET, 3]}}]",
            6,
            "spec.rules[0].to[0].operation.methods[1]: must be a non-empty string, got a number",
        ),
        (
            "selector: {matchLabels: {app: 3}}",
            5,
            "spec.selector.matchLabels.app: label values must be strings, got a number (quote "
            'it: "3")',
        ),
    ],
)
def test_authorization_policy_errors(spec: str, line: int, reason: str) -> None:
    body = textwrap.indent(spec, "  ")
    err = error(
        "apiVersion: security.istio.io/v1\n"
        "kind: AuthorizationPolicy\n"
        "metadata: {name: p, namespace: shop}\n"
        "spec:\n" + body + "\n"
    )
    assert (err.file, err.line) == ("sec.yaml", line)
    assert err.reason == f"AuthorizationPolicy shop/p: {reason}"


def test_competing_namespace_policies_are_reported() -> None:
    doc = """
        apiVersion: security.istio.io/v1
        kind: PeerAuthentication
        metadata: {{name: {name}, namespace: shop}}
        spec: {{mtls: {{mode: {mode}}}}}
        """
    files = [
        load_text(textwrap.dedent(doc.format(name=n, mode=m)).lstrip("\n"), f"{n}.yaml")
        for n, m in (("b", "DISABLE"), ("a", "STRICT"))
    ]
    config = merge(files)
    assert [str(w) for w in config.warnings] == [
        "PeerAuthentication shop/b (b.yaml:1): namespace shop has more than one "
        "PeerAuthentication without selector; only PeerAuthentication shop/a (a.yaml:1) is used"
    ]
    assert len(config.peer_authentications) == 2
