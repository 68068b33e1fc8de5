"""Loading Gateway API objects: versions, errors with file:line, unsupported fields."""

from __future__ import annotations

import pytest

from control.config.errors import ConfigError, DuplicateObjectError
from control.config.loader import load_text
from control.config.merge import merge
from control.model.gatewayapi import GROUP, ApiGateway, ApiRoute, ReferenceGrant
from tests.support.gatewayapi import (
    backend,
    dump,
    gateway,
    gateway_class,
    listener,
    reference_grant,
    route,
    service,
)


def test_every_kind_and_version_loads_without_warnings() -> None:
    objects = [
        gateway_class(),
        gateway(),
        {**gateway("beta"), "apiVersion": f"{GROUP}/v1beta1"},
        route("h"),
        route("g", kind="GRPCRoute"),
        route("g2", kind="GRPCRoute", api_version=f"{GROUP}/v1alpha2"),
        route("t", kind="TLSRoute", api_version=f"{GROUP}/v1alpha2"),
        route("c", kind="TCPRoute", api_version=f"{GROUP}/v1alpha2"),
        reference_grant("rg", "infra", "apps"),
        {**reference_grant("rg1", "infra", "apps"), "apiVersion": f"{GROUP}/v1"},
    ]
    fc = load_text(dump(*objects), "gw.yaml")
    assert fc.warnings == ()
    got = [o for obj in fc.objects for o in obj.gateway_api]
    assert len(got) == len(objects)
    assert sum(isinstance(o, ApiRoute) for o in got) == 5
    assert sum(isinstance(o, ReferenceGrant) for o in got) == 2


def test_gateway_api_gateway_is_not_a_duplicate_of_an_istio_gateway() -> None:
    istio = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "gw", "namespace": "infra"},
        "spec": {
            "selector": {"istio": "ingress"},
            "servers": [
                {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}
            ],
        },
    }
    fc = load_text(dump(gateway_class(), gateway(), istio), "gw.yaml")
    (gw,) = [o for obj in fc.objects for o in obj.gateway_api if isinstance(o, ApiGateway)]
    keys = [obj.key for obj in fc.objects]
    assert ("Gateway.gateway.networking.k8s.io", "infra", "gw") in keys
    assert ("Gateway", "infra", "gw") in keys
    # Both become model Gateways of one name: the Istio one selects by its selector, ours
    # by the gateway-name label.
    mesh = merge([fc])
    selectors = sorted(g.selector for g in mesh.gateways)
    assert selectors == [
        (("gateway.networking.k8s.io/gateway-name", "gw"),),
        (("istio", "ingress"),),
    ]
    # configz shows the objects as written, with their plain kinds.
    assert sorted(dict(raw)["kind"] for _, raw in mesh.raw) == [
        "Gateway",
        "Gateway",
        "GatewayClass",
    ]


def test_two_gateway_api_gateways_of_one_name_are_duplicates() -> None:
    with pytest.raises(DuplicateObjectError) as err:
        load_text(dump(gateway(), gateway()), "gw.yaml")
    assert "duplicate Gateway.gateway.networking.k8s.io infra/gw" in str(err.value)


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (gateway(listeners=[listener(port=0)]), "spec.listeners[0].port: must be an integer"),
        (
            gateway(listeners=[listener("a"), listener("a", 9090)]),
            "listener name 'a' is used twice",
        ),
        (
            gateway(listeners=[listener(hostname="bad host")]),
            "spec.listeners[0].hostname: must be a DNS name",
        ),
        (
            gateway(listeners=[listener(from_="Selector")]),
            "selector: is required when from is Selector",
        ),
        (
            route("r", rules=[{"backendRefs": [{"name": "v1"}]}]),
            "spec.rules[0].backendRefs[0].port: is required for a Service backend",
        ),
        (
            route("r", rules=[{"matches": [{"path": {"type": "Regex", "value": "/"}}]}]),
            "spec.rules[0].matches[0].path.type: must be one of Exact, PathPrefix",
        ),
        (
            route(
                "r", rules=[{"matches": [{"path": {"type": "RegularExpression", "value": "("}}]}]
            ),
            "invalid regular expression",
        ),
        (
            route("r", rules=[{"matches": [{"path": {"value": "no-slash"}}]}]),
            "must start with /",
        ),
        (
            route("r", rules=[{"matches": [{"method": "FETCH"}]}]),
            "spec.rules[0].matches[0].method: must be one of GET",
        ),
        (
            route(
                "r",
                rules=[
                    {
                        "filters": [
                            {"type": "RequestRedirect", "requestRedirect": {"statusCode": 305}}
                        ]
                    }
                ],
            ),
            "statusCode: must be one of 301, 302",
        ),
        (
            route(
                "r",
                rules=[
                    {
                        "filters": [{"type": "RequestRedirect", "requestRedirect": {}}],
                        "backendRefs": [backend("v1")],
                    }
                ],
            ),
            "RequestRedirect cannot be combined with backendRefs",
        ),
        (
            route("g", kind="GRPCRoute", rules=[{"matches": [{"method": {}}]}]),
            "needs service or method",
        ),
        (
            route("t", kind="TCPRoute", api_version=f"{GROUP}/v1alpha2", rules=[{}]),
            "backendRefs: is required",
        ),
        (
            {**gateway_class(), "spec": {}},
            "spec.controllerName: is required",
        ),
    ],
)
def test_invalid_objects_fail_with_file_line_and_path(obj: dict[str, object], message: str) -> None:
    text = dump(service("v1"), obj)
    with pytest.raises(ConfigError) as err:
        load_text(text, "gw.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("gw.yaml:")


def test_unsupported_fields_are_reported_once_and_drop_their_rule() -> None:
    obj = route(
        "r",
        rules=[
            {
                "filters": [{"type": "ExtensionRef", "extensionRef": {"name": "x"}}],
                "backendRefs": [backend("v1")],
            },
            {
                "matches": [{"path": {"value": "/s"}}],
                "sessionPersistence": {"sessionName": "x"},
                "backendRefs": [backend("v1")],
            },
            {"matches": [{"path": {"value": "/ok"}}], "backendRefs": [backend("v1")]},
        ],
    )
    obj["spec"]["futureField"] = 1  # type: ignore[index]
    fc = load_text(dump(obj, obj | {"metadata": {"name": "r2", "namespace": "infra"}}), "gw.yaml")
    messages = [w.message for w in fc.warnings]
    assert messages.count("spec.futureField is not supported; ignored") == 2  # once per object
    assert any("filter ExtensionRef is not supported; this rule is dropped" in m for m in messages)
    assert any("sessionPersistence is not supported; this rule is dropped" in m for m in messages)
    (r, _) = [o for obj in fc.objects for o in obj.gateway_api if isinstance(o, ApiRoute)]
    assert len(r.rules) == 1  # only the rule we can serve whole
    assert len(set(fc.warnings)) == len(fc.warnings)


def test_redirect_with_prefix_replacement_is_reported_not_half_applied() -> None:
    obj = route(
        "r",
        rules=[
            {
                "filters": [
                    {
                        "type": "RequestRedirect",
                        "requestRedirect": {
                            "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/x"}
                        },
                    }
                ]
            }
        ],
    )
    fc = load_text(dump(obj), "gw.yaml")
    assert any("ReplacePrefixMatch in a RequestRedirect" in w.message for w in fc.warnings)
    (r,) = [o for obj in fc.objects for o in obj.gateway_api if isinstance(o, ApiRoute)]
    assert r.rules == ()


def test_unknown_kind_of_the_group_is_ignored_with_a_warning() -> None:
    obj = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "BackendTLSPolicy",
        "metadata": {"name": "p"},
        "spec": {},
    }
    fc = load_text(dump(obj), "gw.yaml")
    assert fc.objects == ()
    assert "kind BackendTLSPolicy" in fc.warnings[0].message
