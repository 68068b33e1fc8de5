"""DestinationRule `workloadSelector`, as Istio: a rule with one applies to the clients of its
namespace whose labels it selects, before the namespace's rules without one (which every
other client keeps); it is never exported beyond its namespace. Clients selected by the same
rules share one outbound plan, and a mesh without such rules keeps its scopes as they were."""

from __future__ import annotations

import textwrap

import pytest
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from google.protobuf.any_pb2 import Any as AnyProto

from control.config.errors import ConfigError
from control.config.loader import load_text
from control.config.merge import merge
from control.generate import GENERATORS
from control.generate.context import GenContext
from control.generate.plans import outbound_plan
from control.generate.resource_names import CLUSTER_TYPE
from control.model.index import MeshIndex
from control.model.proxy import Proxy, proxy_from_node
from control.model.types import MeshConfig, labels_of
from control.xds.cache import ResourceCache
from tests.support.traffic import mesh_config, service, workload_entry

SELECTED = """
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews-testers, namespace: default}
spec:
  host: reviews
  workloadSelector: {matchLabels: {role: tester}}
  trafficPolicy: {loadBalancer: {simple: LEAST_REQUEST}}
"""
CATCH_ALL = """
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews
  trafficPolicy: {loadBalancer: {simple: RANDOM}}
"""
CLUSTER = "outbound|9080||reviews.default.svc.cluster.local"


def _client(name: str, namespace: str = "default", **labels: str) -> Proxy:
    return proxy_from_node(
        f"sidecar~127.0.7.1~{name}.{namespace}~{namespace}.svc.cluster.local",
        {"LABELS": labels, "NAMESPACE": namespace},
    )


def _lb(ctx: GenContext, proxy: Proxy) -> int:
    found = GENERATORS[CLUSTER_TYPE](ctx, proxy)[CLUSTER]
    return Cluster.FromString(AnyProto.FromString(found.any_bytes).value).lb_policy


def _config(*rules: str) -> MeshConfig:
    return mesh_config(
        service("reviews", "reviews"),
        workload_entry("reviews-1", "127.0.7.9", app="reviews"),
        *rules,
    )


def test_a_selected_rule_applies_to_its_clients_before_the_catch_all() -> None:
    config = _config(SELECTED, CATCH_ALL)
    assert [str(w) for w in config.warnings] == []  # no conflict between the two
    ctx = GenContext(MeshIndex(config, []), ResourceCache())
    assert _lb(ctx, _client("t1", role="tester", app="a")) == Cluster.LEAST_REQUEST
    assert _lb(ctx, _client("p1", app="a")) == Cluster.RANDOM
    # Another namespace's clients with the labels: the selector does not cross namespaces.
    assert _lb(ctx, _client("o1", "other", role="tester")) == Cluster.RANDOM


def test_clients_selected_alike_share_a_plan() -> None:
    ctx = GenContext(MeshIndex(_config(SELECTED), []), ResourceCache())
    first = outbound_plan(ctx, _client("t1", role="tester", app="a"))
    second = outbound_plan(ctx, _client("t2", role="tester", app="b"))
    plain = outbound_plan(ctx, _client("p1", app="a"))
    assert first is second
    assert plain is not first
    assert _lb(ctx, _client("p1", app="a")) == Cluster.ROUND_ROBIN  # no rule for it


def test_scopes_without_selected_rules_are_what_they_were() -> None:
    index = MeshIndex(_config(CATCH_ALL), [])
    assert index.traffic_scope("default", labels_of({"role": "tester"})) == "default"
    assert index.traffic_scope("other", labels_of({"role": "tester"})) == ""
    selected = MeshIndex(_config(SELECTED), [])
    assert selected.traffic_scope("default", labels_of({"role": "tester"})) == (
        "default#reviews-testers"
    )
    assert selected.traffic_scope("default", labels_of({"role": "x"})) == "default"


def _rule(extra: str) -> str:
    return (
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\n"
        "metadata: {name: r, namespace: default}\nspec:\n  host: reviews\n" + extra
    )


def test_parsing() -> None:
    (rule,) = merge(
        [load_text(_rule("  workloadSelector: {matchLabels: {role: tester}}\n"), "t.yaml")]
    ).destination_rules
    assert rule.workload_selector == labels_of({"role": "tester"})
    assert rule.export_to == (".",)  # its namespace only


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("  workloadSelector: {matchLabels: {}}\n", "must have at least one label"),
        (
            "  workloadSelector: {matchLabels: {a: b}}\n  exportTo: ['*']\n",
            "exportTo: with workloadSelector may only be '.'",
        ),
    ],
)
def test_parsing_errors(extra: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(textwrap.dedent(_rule(extra)), "t.yaml")
    assert message in str(info.value)


def test_two_rules_selecting_alike_conflict_as_two_catch_alls_do() -> None:
    twin = SELECTED.replace("reviews-testers", "reviews-testers-2")
    config = _config(SELECTED, twin)
    assert len(config.warnings) == 1
    assert "reviews-testers (first by name) is used" in str(config.warnings[0])
