"""VirtualService delegation (`http[].delegate`), as Istio: Istio's validation of roots and
delegates, the merge of each delegating route with the delegate's routes (match conditions
combined, a delegate match outside the root's dropped, the root's settings inherited), the
routes that cannot be resolved dropped with a warning, and the merged routes at a sidecar
and at a gateway, including an edit of the delegate alone reaching the next push."""

from __future__ import annotations

import textwrap

import pytest
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from google.protobuf.any_pb2 import Any as AnyProto

from control.config.errors import ConfigError
from control.config.loader import load_text
from control.generate import GENERATORS, ROUTER_GENERATORS
from control.generate.context import GenContext, next_context
from control.generate.resource_names import ROUTE_TYPE
from control.model.index import MeshIndex
from control.model.proxy import Proxy, proxy_from_node
from control.model.traffic import (
    Delegate,
    HeaderMatch,
    HttpRoute,
    MatchKind,
    Retries,
    StringMatch,
    VirtualService,
)
from control.model.types import MeshConfig
from control.xds.cache import ResourceCache
from tests.support.gateways import istio_gateway, router
from tests.support.traffic import mesh_config, service, subsets_rule

ROOT = """
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: root, namespace: front}
spec:
  hosts: [reviews.default.svc.cluster.local]
  http:
  - name: api
    match: [{uri: {prefix: /api}, headers: {x-team: {exact: a}}}]
    delegate: {name: api, namespace: default}
    timeout: 3s
    retries: {attempts: 2}
    headers: {request: {set: {x-root: "1"}}}
  - route: [{destination: {host: reviews.default.svc.cluster.local, subset: v1}}]
"""

DELEGATE = """
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: api, namespace: default}
spec:
  exportTo: [front]
  http:
  - name: v2
    match: [{uri: {prefix: /api/v2}, headers: {x-user: {exact: jason}}}]
    route: [{destination: {host: reviews, subset: v2}}]
    timeout: 1s
  - name: other
    match: [{uri: {prefix: /other}}]
    route: [{destination: {host: reviews, subset: v2}}]
  - route: [{destination: {host: reviews, subset: v1}}]
"""


def _load(text: str) -> object:
    return load_text(textwrap.dedent(text).lstrip("\n"), "t.yaml")


def _config(*parts: str) -> MeshConfig:
    return mesh_config(service("reviews", "reviews"), subsets_rule("reviews"), *parts)


def _warnings(config: MeshConfig) -> str:
    return "\n".join(str(w) for w in config.warnings)


def _vs(config: MeshConfig, name: str) -> VirtualService:
    (vs,) = [v for v in config.virtual_services if v.name == name]
    return vs


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "reason"),
    [
        (
            "  - delegate: {name: d}\n    route: [{destination: {host: a}}]\n",
            "spec.http[0].route: cannot be combined with delegate",
        ),
        (
            "  - delegate: {name: d}\n    redirect: {uri: /x}\n",
            "spec.http[0].redirect: cannot be combined with delegate",
        ),
        (
            "  - delegate: {name: d}\n    directResponse: {status: 200}\n",
            "spec.http[0].directResponse: cannot be combined with delegate",
        ),
        ("  - delegate: {namespace: x}\n", "spec.http[0].delegate.name: is required"),
        ("  - delegate: {name: D_d}\n", "spec.http[0].delegate.name: 'D_d'"),
    ],
)
def test_a_delegating_route_has_no_action_of_its_own(route: str, reason: str) -> None:
    text = "kind: VirtualService\napiVersion: networking.istio.io/v1\n"
    text += "metadata: {name: r, namespace: shop}\nspec:\n  hosts: [web]\n  http:\n" + route
    with pytest.raises(ConfigError) as err:
        _load(text)
    assert reason in str(err.value)


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ("  gateways: [mesh]\n", "spec.gateways: must not be set in a delegate VirtualService"),
        (
            "  tcp: [{route: [{destination: {host: a}}]}]\n",
            "spec.tcp: must not be set in a delegate VirtualService",
        ),
        (
            "  tls: [{match: [{sniHosts: [a]}], route: [{destination: {host: a}}]}]\n",
            "spec.tls: must not be set in a delegate VirtualService",
        ),
        (
            "  - delegate: {name: other}\n",
            "spec.http[1].delegate: a delegate VirtualService's routes cannot delegate again",
        ),
    ],
)
def test_a_delegate_has_no_hosts_gateways_or_l4_routes_and_delegates_no_further(
    extra: str, reason: str
) -> None:
    text = "kind: VirtualService\napiVersion: networking.istio.io/v1\n"
    text += "metadata: {name: d, namespace: shop}\nspec:\n"
    http = "  http:\n  - route: [{destination: {host: a}}]\n"
    text += http + extra if extra.startswith("  -") else extra + http
    with pytest.raises(ConfigError) as err:
        _load(text)
    assert reason in str(err.value)


def test_parsed_delegation_keeps_the_written_form() -> None:
    fc = _load(ROOT + DELEGATE)
    root, delegate = (o.virtual_services[0] for o in fc.objects)  # type: ignore[attr-defined]
    # The namespace is the root's when not given.
    assert root.http[0].delegate == Delegate("api", "default")
    assert root.http[0].destinations == ()
    assert delegate.hosts == () and delegate.export_to == ("front",)
    bare = _load(ROOT.replace("namespace: default}", "}"))
    assert bare.objects[0].virtual_services[0].http[0].delegate == Delegate("api", "front")  # type: ignore[attr-defined]


# --- merge -----------------------------------------------------------------------------------


def test_delegate_routes_replace_the_delegating_route_in_order() -> None:
    config = _config(ROOT, DELEGATE)
    names = [v.name for v in config.virtual_services]
    assert "api" not in names  # a delegate never applies on its own
    root = _vs(config, "root")
    assert [r.name for r in root.http] == ["api-v2", "api", ""]
    v2, rest, last = root.http
    # Prefix within the root's prefix, headers of both; the delegate's catch-all gets the
    # root's match.
    (m,) = v2.matches
    assert m.uri == StringMatch(MatchKind.PREFIX, "/api/v2")
    assert set(m.headers) == {
        HeaderMatch("x-team", StringMatch(MatchKind.EXACT, "a")),
        HeaderMatch("x-user", StringMatch(MatchKind.EXACT, "jason")),
    }
    (m,) = rest.matches
    assert m.uri == StringMatch(MatchKind.PREFIX, "/api")
    assert m.headers == (HeaderMatch("x-team", StringMatch(MatchKind.EXACT, "a")),)
    assert [d.subset for d in v2.destinations] == ["v2"]
    assert [d.subset for d in rest.destinations] == ["v1"]
    # The delegate's destinations were resolved in its own namespace.
    assert v2.destinations[0].host == "reviews.default.svc.cluster.local"
    # Inherited where the delegate's route does not set them; its own win.
    assert v2.timeout == 1.0 and rest.timeout == 3.0
    assert v2.retries == rest.retries == Retries(attempts=2)
    assert v2.headers.request_set == rest.headers.request_set == (("x-root", "1"),)
    assert all(r.delegate is None for r in root.http)
    assert last.destinations[0].subset == "v1" and not last.matches
    # `/other` lies outside `/api`: that route is dropped, with a warning at the delegate.
    text = _warnings(config)
    assert (
        "route other of delegate VirtualService default/api matches outside the route of "
        "front/root that delegates to it; this route is ignored there"
    ) in text
    # The written objects are what configz shows.
    assert any(ref.name == "api" and ref.kind == "VirtualService" for ref, _ in config.raw)


@pytest.mark.parametrize(
    ("root_match", "leaf_match", "merged"),
    [
        # Exact within a prefix.
        ("{uri: {prefix: /a}}", "{uri: {exact: /a/b}}", [("exact", "/a/b")]),
        # A root exact admits only the same exact.
        ("{uri: {exact: /a}}", "{uri: {exact: /a}}", [("exact", "/a")]),
        ("{uri: {exact: /a}}", "{uri: {prefix: /a}}", None),
        ("{uri: {exact: /a}}", "{uri: {exact: /b}}", None),
        # A regex on either side fits with nothing set on the other.
        ("{uri: {regex: /a.*}}", "{uri: {prefix: /a}}", None),
        ("{uri: {prefix: /a}}", "{uri: {regex: /a.*}}", None),
        ("{uri: {regex: /a.*}}", "{method: {exact: GET}}", [("regex", "/a.*")]),
        ("{uri: {prefix: /a/b}}", "{uri: {prefix: /a}}", None),
        ("{headers: {x: {exact: '1'}}}", "{headers: {x: {exact: '2'}}}", None),
        ("{headers: {x: {prefix: '1'}}}", "{headers: {x: {exact: '12'}}}", [None]),
        ("{port: 80}", "{port: 81}", None),
        ("{sourceNamespace: a}", "{sourceNamespace: b}", None),
        ("{sourceLabels: {app: a}}", "{sourceLabels: {app: b}}", None),
        ("{ignoreUriCase: true, uri: {prefix: /a}}", "{uri: {prefix: /a}}", None),
    ],
)
def test_match_conditions_combine_as_istio_merges_them(
    root_match: str, leaf_match: str, merged: list[tuple[str, str] | None] | None
) -> None:
    root = ROOT.replace(
        "match: [{uri: {prefix: /api}, headers: {x-team: {exact: a}}}]", f"match: [{root_match}]"
    )
    delegate = textwrap.dedent(
        f"""
        ---
        apiVersion: networking.istio.io/v1
        kind: VirtualService
        metadata: {{name: api, namespace: default}}
        spec:
          http:
          - match: [{leaf_match}]
            route: [{{destination: {{host: reviews, subset: v2}}}}]
        """
    )
    config = _config(root, delegate)
    http = _vs(config, "root").http
    if merged is None:
        assert len(http) == 1  # only the root's own last route is left
        assert "matches outside the route of front/root" in _warnings(config)
        return
    uris = [(m.uri.kind.value, m.uri.value) if m.uri else None for m in http[0].matches]
    assert uris == merged


def test_a_delegate_match_is_combined_with_every_root_match_it_fits() -> None:
    root = ROOT.replace(
        "match: [{uri: {prefix: /api}, headers: {x-team: {exact: a}}}]",
        "match: [{uri: {prefix: /api}}, {uri: {prefix: /v1/api}}, {method: {exact: GET}}]",
    )
    delegate = DELEGATE.replace("prefix: /api/v2", "prefix: /api/v2/")
    http = _vs(_config(root, delegate), "root").http
    # `/api/v2/` fits `/api` and the method-only match (with the method kept), not `/v1/api`.
    first = http[0].matches
    assert [(m.uri.value if m.uri else "", m.method) for m in first] == [
        ("/api/v2/", None),
        ("/api/v2/", StringMatch(MatchKind.EXACT, "GET")),
    ]


HOSTED = """
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: default}
spec:
  hosts: [ratings]
  http: [{route: [{destination: {host: reviews}}]}]
"""
TO_API = "name: api, namespace: default"


@pytest.mark.parametrize(
    ("root", "delegate", "why"),
    [
        (
            ROOT.replace(TO_API, "name: none, namespace: default"),
            DELEGATE,
            "delegate VirtualService default/none does not exist",
        ),
        (
            ROOT,
            DELEGATE.replace("exportTo: [front]", "exportTo: ['.']"),
            "delegate VirtualService default/api is not exported to namespace front",
        ),
        (
            ROOT.replace(TO_API, "name: reviews, namespace: default"),
            DELEGATE + HOSTED,
            "delegate VirtualService default/reviews has hosts, so it is not a delegate",
        ),
    ],
    ids=["missing", "not-exported", "has-hosts"],
)
def test_an_unresolved_delegate_drops_the_route_with_a_warning(
    root: str, delegate: str, why: str
) -> None:
    config = _config(root, delegate)
    text = _warnings(config)
    assert f"{why}" in text
    assert "; the route delegating to it is ignored" in text
    assert "mesh.yaml:" in text  # at the root, with file and line
    http = _vs(config, "root").http
    assert len(http) == 1 and not http[0].matches  # the root's catch-all only


def test_a_delegate_exported_to_everyone_or_in_the_roots_namespace_is_used() -> None:
    for delegate in (
        DELEGATE.replace("  exportTo: [front]\n", ""),
        DELEGATE.replace("exportTo: [front]", "exportTo: ['.']").replace(
            "namespace: default}", "namespace: front}", 1
        ),
    ):
        root = ROOT if "front}" not in delegate else ROOT.replace("namespace: default}", "}")
        config = _config(root, delegate)
        assert "the route delegating to it is ignored" not in _warnings(config)
        assert len(_vs(config, "root").http) == 3


def test_without_delegation_the_merge_keeps_every_object() -> None:
    plain = ROOT.replace(
        "    delegate: {name: api, namespace: default}\n",
        "    route: [{destination: {host: reviews.default.svc.cluster.local}}]\n",
    )
    config = _config(plain)
    vs = _vs(config, "root")
    assert config.virtual_services[0] is vs
    assert [r.delegate for r in vs.http] == [None, None]
    assert isinstance(vs.http[0], HttpRoute)


# --- generated routes: sidecar and gateway ---------------------------------------------------

V1 = "outbound|9080|v1|reviews.default.svc.cluster.local"
V2 = "outbound|9080|v2|reviews.default.svc.cluster.local"


def _client() -> Proxy:
    return proxy_from_node("sidecar~127.0.4.1~c.front~front.svc.cluster.local", {})


def _table(found: object) -> RouteConfiguration:
    any_bytes = found.any_bytes  # type: ignore[attr-defined]
    return RouteConfiguration.FromString(AnyProto.FromString(any_bytes).value)


def _sidecar_routes(ctx: GenContext) -> list[tuple[str, str]]:
    table = _table(GENERATORS[ROUTE_TYPE](ctx, _client())["9080"])
    (vhost,) = [v for v in table.virtual_hosts if v.name.startswith("reviews.")]
    return [(r.match.prefix or r.match.path, r.route.cluster) for r in vhost.routes]


SIMPLE_ROOT = ROOT.replace(", headers: {x-team: {exact: a}}", "")
SIMPLE_DELEGATE = DELEGATE.replace(", headers: {x-user: {exact: jason}}", "")


def test_sidecar_gets_the_merged_routes_and_an_edit_of_the_delegate_alone() -> None:
    ctx = GenContext(MeshIndex(_config(SIMPLE_ROOT, SIMPLE_DELEGATE), []), ResourceCache())
    assert _sidecar_routes(ctx) == [("/api/v2", V2), ("/api", V1), ("/", V1)]
    # Only the delegate changes: `/api/v2` now goes to v1 and the rest of `/api` to v2.
    edited = SIMPLE_DELEGATE.replace("subset: v2}}]\n    timeout", "subset: v1}}]\n    timeout")
    edited = edited.replace(
        "  - route: [{destination: {host: reviews, subset: v1}}]",
        "  - route: [{destination: {host: reviews, subset: v2}}]",
    )
    ctx = next_context(ctx, ctx.index.next(_config(SIMPLE_ROOT, edited), version=1))
    assert _sidecar_routes(ctx) == [("/api/v2", V1), ("/api", V2), ("/", V1)]


GATEWAY = "\n" + istio_gateway(
    "public",
    "- port: {number: 80, name: http, protocol: HTTP}\n  hosts: [shop.example.com]",
    namespace="edge",
)

GATEWAY_ROOT = (
    SIMPLE_ROOT.replace("hosts: [reviews.default.svc.cluster.local]", "hosts: [shop.example.com]")
    .replace("  http:\n", "  gateways: [edge/public]\n  http:\n")
    .replace(
        "reviews.default.svc.cluster.local, subset: v1",
        "reviews.default.svc.cluster.local, subset: v1, port: {number: 9080}",
    )
)


def _gateway_routes(ctx: GenContext) -> list[tuple[str, str]]:
    proxy = router({"istio": "ingressgateway"}, namespace="edge")
    table = _table(ROUTER_GENERATORS[ROUTE_TYPE](ctx, proxy)["http.80"])
    (vhost,) = table.virtual_hosts
    return [(r.match.prefix or r.match.path, r.route.cluster) for r in vhost.routes]


def test_gateway_gets_the_merged_routes_and_an_edit_of_the_delegate_alone() -> None:
    config = _config(GATEWAY, GATEWAY_ROOT, SIMPLE_DELEGATE)
    ctx = GenContext(MeshIndex(config, []), ResourceCache())
    assert _gateway_routes(ctx) == [("/api/v2", V2), ("/api", V1), ("/", V1)]
    edited = SIMPLE_DELEGATE.replace("prefix: /api/v2", "prefix: /api/v3")
    ctx = next_context(ctx, ctx.index.next(_config(GATEWAY, GATEWAY_ROOT, edited), version=1))
    assert _gateway_routes(ctx) == [("/api/v3", V2), ("/api", V1), ("/", V1)]
