"""Locality load balancing (`localityLbSetting` of a DestinationRule or the mesh config), as
Istio applies it: parsing and Istio's validation, where a proxy's locality comes from, the
priorities and weights of one client's assignment, and the EDS/CDS a client gets (clients in
one locality share their assignments; clusters without it keep the set every client shares)."""

from __future__ import annotations

import dataclasses
import textwrap

import pytest
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.core.v3.base_pb2 import Node
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from google.protobuf.any_pb2 import Any as AnyProto

from control.config.errors import ConfigError
from control.config.loader import load_text
from control.config.merge import merge
from control.config.meshconfig import parse_mesh_config
from control.generate import GENERATORS
from control.generate.context import GenContext, next_context
from control.generate.grpc_clusters import build_grouped_assignment
from control.generate.locality_lb import (
    LocalityLb,
    assignment_groups,
    cluster_locality_lb,
    locality_matches,
)
from control.generate.resource_names import CLUSTER_TYPE, ENDPOINT_TYPE
from control.kube.workloads import pod_workload
from control.model.index import MeshIndex
from control.model.meshconfig import MeshSettings
from control.model.proxy import Proxy, proxy_from_node
from control.model.traffic import (
    LoadBalancer,
    LocalityDistribute,
    LocalityFailover,
    LocalityLbSetting,
    OutlierDetection,
    TrafficPolicy,
)
from control.model.types import Endpoint, labels_of
from control.xds.cache import ResourceCache
from control.xds.connection import node_locality
from tests.support.traffic import mesh_config, service

# --- parsing -------------------------------------------------------------------------------


def _rule(policy: str) -> str:
    return (
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\n"
        "metadata: {name: r, namespace: default}\nspec:\n  host: geo\n"
        f"  trafficPolicy:\n{textwrap.indent(textwrap.dedent(policy), '    ')}"
    )


def test_a_destination_rule_setting_parses() -> None:
    config = load_text(
        _rule(
            """
            outlierDetection: {consecutive5xxErrors: 1}
            loadBalancer:
              simple: ROUND_ROBIN
              localityLbSetting:
                enabled: true
                failover: [{from: us-east, to: eu-west}]
                failoverPriority: [env, "tier=gold"]
            """
        ),
        "t.yaml",
    )
    assert [str(w) for w in config.warnings] == []
    (rule,) = merge([config]).destination_rules
    assert rule.policy is not None and rule.policy.load_balancer is not None
    assert rule.policy.load_balancer.locality == LocalityLbSetting(
        enabled=True,
        failover=(LocalityFailover("us-east", "eu-west"),),
        failover_priority=("env", "tier=gold"),
    )
    config = load_text(
        _rule(
            """
            loadBalancer:
              localityLbSetting:
                distribute:
                - from: us-east/zone1/*
                  to: {"us-east/zone1/*": 70, "us-east/*": 30}
            """
        ),
        "t.yaml",
    )
    (rule,) = merge([config]).destination_rules
    assert rule.policy is not None and rule.policy.load_balancer is not None
    assert rule.policy.load_balancer.locality == LocalityLbSetting(
        distribute=(
            LocalityDistribute("us-east/zone1/*", (("us-east/zone1/*", 70), ("us-east/*", 30))),
        )
    )


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "{distribute: [{from: a, to: {a: 100}}], failover: [{from: a, to: b}]}",
            "set either distribute or failover, not both",
        ),
        ("{distribute: [{from: a, to: {a: 60, b: 30}}]}", "weights must add up to 100 (got 90)"),
        (
            "{distribute: [{from: a, to: {a: 0, b: 100}}]}",
            "locality weight must be an integer 1-100",
        ),
        ("{distribute: [{from: a/*/c, to: {a: 100}}]}", "with '*' only as its last part"),
        ("{distribute: [{from: a, to: {a/b/c/d: 100}}]}", "must be region, region/zone"),
        (
            "{distribute: [{from: a, to: {a: 100}}, {from: a, to: {b: 100}}]}",
            "repeats a 'from' locality",
        ),
        ("{distribute: [{from: a}]}", "to: is required"),
        ("{failover: [{from: a, to: a}]}", "from and to must be different regions"),
        ("{failover: [{from: a/z, to: b}]}", "must be a region, without '/' or '*'"),
        (
            "{failover: [{from: a, to: b}], failoverPriority: [topology.kubernetes.io/zone]}",
            "cannot be the topology label",
        ),
        ("{failoverPriority: ['bad key!']}", "failoverPriority[0]"),
        ("{enabled: yes please}", "enabled: must be true or false"),
    ],
)
def test_destination_rule_setting_errors(setting: str, message: str) -> None:
    text = _rule(f"loadBalancer: {{localityLbSetting: {setting}}}\n")
    with pytest.raises(ConfigError) as info:
        load_text(text, "t.yaml")
    assert message in str(info.value)


def test_failover_without_outlier_detection_is_said_to_do_nothing() -> None:
    config = load_text(
        _rule("loadBalancer: {localityLbSetting: {failover: [{from: a, to: b}]}}\n"), "t.yaml"
    )
    assert [w.message for w in config.warnings] == [
        "spec.trafficPolicy.loadBalancer: localityLbSetting failover needs outlierDetection; "
        "without it, it has no effect"
    ]


def test_the_mesh_setting_defaults_to_on_as_istio() -> None:
    assert MeshSettings().locality_lb == LocalityLbSetting(enabled=True)
    assert parse_mesh_config("trustDomain: x\n", "m.yaml").locality_lb == LocalityLbSetting(
        enabled=True
    )
    off = parse_mesh_config("localityLbSetting: {enabled: false}\n", "m.yaml")
    assert off.locality_lb == LocalityLbSetting(enabled=False)
    assert off.warnings == ()
    with pytest.raises(ConfigError, match="weights must add up to 100"):
        parse_mesh_config("localityLbSetting: {distribute: [{from: a, to: {a: 5}}]}\n", "m.yaml")


# --- where a proxy is -----------------------------------------------------------------------

NODE_ID = "sidecar~127.0.4.1~c.default~default.svc.cluster.local"


def test_a_proxy_locality_comes_from_its_node_then_its_labels() -> None:
    node = Node(id=NODE_ID)
    node.locality.region, node.locality.zone = "us-east", "zone1"
    assert node_locality(node.locality) == "us-east/zone1"
    assert node_locality(Node().locality) == ""
    labels = {"istio-locality": "eu-west.zone2.c"}
    assert proxy_from_node(NODE_ID, {"LABELS": labels}).locality == "eu-west/zone2/c"
    # The node's own wins over the labels.
    assert proxy_from_node(NODE_ID, {"LABELS": labels}, "us-east/zone1").locality == "us-east/zone1"
    topology = {"topology.kubernetes.io/region": "r", "topology.kubernetes.io/zone": "z"}
    assert proxy_from_node(NODE_ID, {"LABELS": topology}).locality == "r/z"
    assert proxy_from_node(NODE_ID, {}).locality == ""


def test_a_pod_locality_comes_from_its_labels() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "default", "labels": {"istio-locality": "r.z.s"}},
        "spec": {},
        "status": {
            "podIP": "10.0.0.1",
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    workload = pod_workload(pod)
    assert workload is not None and workload.locality == "r/z/s"


# --- one client's assignment -------------------------------------------------------------------


def _policy(setting: LocalityLbSetting | None, outlier: bool = True) -> TrafficPolicy:
    return TrafficPolicy(
        load_balancer=LoadBalancer(locality=setting),
        outlier_detection=OutlierDetection(consecutive_5xx=1) if outlier else None,
    )


def test_which_setting_applies() -> None:
    mesh = LocalityLbSetting(enabled=True)
    failover = cluster_locality_lb(mesh, _policy(None))
    assert failover == LocalityLb(mesh, failover=True)
    # Failover needs outlier detection; without a rule of its own, nothing changes.
    assert cluster_locality_lb(mesh, _policy(None, outlier=False)) is None
    assert cluster_locality_lb(mesh, None) is None
    # The rule's `enabled: false` turns it off; the mesh's too, unless the rule has one.
    off = LocalityLbSetting(enabled=False)
    assert cluster_locality_lb(mesh, _policy(off)) is None
    assert cluster_locality_lb(off, _policy(None)) is None
    own = LocalityLbSetting(failover=(LocalityFailover("a", "b"),))
    assert cluster_locality_lb(off, _policy(own)) == LocalityLb(own, failover=True)
    # distribute applies without outlier detection.
    spread = LocalityLbSetting(distribute=(LocalityDistribute("*", (("a", 100),)),))
    found = cluster_locality_lb(None, _policy(spread, outlier=False))
    assert found is not None and found.weighted and not found.failover


def test_locality_patterns_match_as_istio() -> None:
    here = ("us-east", "zone1", "a")
    assert locality_matches(here, "us-east")  # missing parts match anything
    assert locality_matches(here, "us-east/zone1/*")
    assert locality_matches(here, "*")
    assert not locality_matches(here, "us-east/zone2")
    assert not locality_matches(here, "eu-west/*")


def _endpoints(*specs: tuple[str, str, dict[str, str]]) -> tuple[Endpoint, ...]:
    return tuple(
        Endpoint(address=ip, port=8080, locality=locality, labels=labels_of(labels))
        for ip, locality, labels in specs
    )


def _groups(
    lb: LocalityLb, client: str, eps: tuple[Endpoint, ...], **labels: str
) -> list[tuple[str, int, int, list[str]]]:
    return [
        (locality, priority, weight, [k[0] for k in members])
        for locality, priority, weight, members in assignment_groups(lb, client, labels, eps)
    ]


FAR_AND_NEAR = _endpoints(
    ("10.0.0.1", "us-east/zone1/a", {}),
    ("10.0.0.2", "us-east/zone1/b", {}),
    ("10.0.0.3", "us-east/zone2/a", {}),
    ("10.0.0.4", "eu-west/zone1/a", {}),
    ("10.0.0.5", "ap-south/zone1/a", {}),
)


def test_failover_priorities_by_locality_without_gaps() -> None:
    lb = LocalityLb(LocalityLbSetting(enabled=True), failover=True)
    assert _groups(lb, "us-east/zone1/a", FAR_AND_NEAR) == [
        ("ap-south/zone1/a", 3, 0, ["10.0.0.5"]),
        ("eu-west/zone1/a", 3, 0, ["10.0.0.4"]),
        ("us-east/zone1/a", 0, 0, ["10.0.0.1"]),
        ("us-east/zone1/b", 1, 0, ["10.0.0.2"]),
        ("us-east/zone2/a", 2, 0, ["10.0.0.3"]),
    ]
    # Only what is present is numbered: a client in eu-west sees 0 (its own) and 1 (others).
    assert {(loc, p) for loc, p, _, _ in _groups(lb, "eu-west/zone1/a", FAR_AND_NEAR)} == {
        ("eu-west/zone1/a", 0),
        ("us-east/zone1/a", 1),
        ("us-east/zone1/b", 1),
        ("us-east/zone2/a", 1),
        ("ap-south/zone1/a", 1),
    }


def test_a_failover_rule_puts_its_region_before_the_others() -> None:
    setting = LocalityLbSetting(failover=(LocalityFailover("us-east", "ap-south"),))
    groups = _groups(LocalityLb(setting, failover=True), "us-east/zone1/a", FAR_AND_NEAR)
    priorities = {loc: p for loc, p, _, _ in groups}
    assert priorities["ap-south/zone1/a"] == 3
    assert priorities["eu-west/zone1/a"] == 4


def test_distribute_weighs_localities_and_leaves_the_rest_out() -> None:
    setting = LocalityLbSetting(
        distribute=(
            LocalityDistribute(
                "us-east/zone1/*", (("us-east/zone1/*", 80), ("us-east/zone2/*", 20))
            ),
        )
    )
    lb = LocalityLb(setting, failover=False)
    # The zone1 share is split between its two subzones by their endpoints (1 each): 40/40.
    assert _groups(lb, "us-east/zone1/a", FAR_AND_NEAR) == [
        ("us-east/zone1/a", 0, 40, ["10.0.0.1"]),
        ("us-east/zone1/b", 0, 40, ["10.0.0.2"]),
        ("us-east/zone2/a", 0, 20, ["10.0.0.3"]),
    ]
    # A client no rule is for: every locality, weighed by its endpoints.
    assert [(loc, w) for loc, _, w, _ in _groups(lb, "eu-west/zone1/a", FAR_AND_NEAR)] == [
        ("ap-south/zone1/a", 1),
        ("eu-west/zone1/a", 1),
        ("us-east/zone1/a", 1),
        ("us-east/zone1/b", 1),
        ("us-east/zone2/a", 1),
    ]


def test_failover_priority_ranks_endpoints_by_the_labels_they_share() -> None:
    eps = _endpoints(
        ("10.0.1.1", "r/z", {"env": "prod", "tier": "gold"}),
        ("10.0.1.2", "r/z", {"env": "prod", "tier": "iron"}),
        ("10.0.1.3", "r/z", {"env": "test", "tier": "gold"}),
    )
    lb = LocalityLb(LocalityLbSetting(failover_priority=("env", "tier")), failover=True)
    # One locality split in three groups: all labels shared, the first only, neither.
    assert _groups(lb, "r/z", eps, env="prod", tier="gold") == [
        ("r/z", 0, 0, ["10.0.1.1"]),
        ("r/z", 1, 0, ["10.0.1.2"]),
        ("r/z", 2, 0, ["10.0.1.3"]),
    ]
    # `key=value` pins the value compared with, whatever the client's label.
    pinned = LocalityLb(LocalityLbSetting(failover_priority=("env=test",)), failover=True)
    assert _groups(pinned, "r/z", eps, env="prod") == [
        ("r/z", 0, 0, ["10.0.1.3"]),
        ("r/z", 1, 0, ["10.0.1.1", "10.0.1.2"]),
    ]
    # Topology labels compare localities.
    zoned = LocalityLb(
        LocalityLbSetting(failover_priority=("topology.kubernetes.io/zone",)), failover=True
    )
    groups = _groups(zoned, "us-east/zone1/x", FAR_AND_NEAR, app="c")
    assert {loc: p for loc, p, _, _ in groups}["eu-west/zone1/a"] == 0
    assert {loc: p for loc, p, _, _ in groups}["us-east/zone2/a"] == 1


# --- what a client is sent -------------------------------------------------------------------

GEO = """
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: near, namespace: default}
spec: {address: "127.0.5.1", labels: {app: geo}, locality: us-east/zone1/a}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: far, namespace: default}
spec: {address: "127.0.5.2", labels: {app: geo}, locality: eu-west/zone1/a}
"""
GEO_CLA = "outbound|9080||geo.default.svc.cluster.local"
FAILOVER = """
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: geo, namespace: default}
spec: {host: geo, trafficPolicy: {outlierDetection: {consecutive5xxErrors: 1}}}
"""


def _client(ip: str, locality: str) -> Proxy:
    return proxy_from_node(
        f"sidecar~{ip}~c{ip[-1]}.default~default.svc.cluster.local",
        {"LABELS": {"app": "client", "istio-locality": locality}},
    )


def _assignment(ctx: GenContext, proxy: Proxy) -> tuple[dict[str, int], bytes]:
    found = GENERATORS[ENDPOINT_TYPE](ctx, proxy)[GEO_CLA]
    cla = ClusterLoadAssignment.FromString(AnyProto.FromString(found.any_bytes).value)
    return {e.locality.region: e.priority for e in cla.endpoints}, found.any_bytes


def test_each_locality_gets_its_own_assignment_and_shares_it() -> None:
    ctx = GenContext(
        MeshIndex(mesh_config(service("geo", "geo"), GEO, FAILOVER), []), ResourceCache()
    )
    east, east_bytes = _assignment(ctx, _client("127.0.6.1", "us-east.zone1.a"))
    west, west_bytes = _assignment(ctx, _client("127.0.6.2", "eu-west.zone1.b"))
    assert east == {"us-east": 0, "eu-west": 1}
    assert west == {"us-east": 1, "eu-west": 0}
    _, again = _assignment(ctx, _client("127.0.6.3", "us-east.zone1.a"))
    assert again is east_bytes  # the same locality shares the bytes
    assert east_bytes != west_bytes


def test_without_locality_balancing_every_client_shares_one_set() -> None:
    ctx = GenContext(MeshIndex(mesh_config(service("geo", "geo"), GEO), []), ResourceCache())
    east = GENERATORS[ENDPOINT_TYPE](ctx, _client("127.0.6.1", "us-east.zone1.a"))
    west = GENERATORS[ENDPOINT_TYPE](ctx, _client("127.0.6.2", "eu-west.zone1.b"))
    assert east is west
    cla = ClusterLoadAssignment.FromString(AnyProto.FromString(east[GEO_CLA].any_bytes).value)
    assert [e.priority for e in cla.endpoints] == [0, 0]


def test_distribute_turns_on_locality_weighted_balancing_on_the_cluster() -> None:
    rule = textwrap.dedent(
        """
        ---
        apiVersion: networking.istio.io/v1
        kind: DestinationRule
        metadata: {name: geo, namespace: default}
        spec:
          host: geo
          trafficPolicy:
            loadBalancer:
              localityLbSetting:
                distribute: [{from: "us-east/*", to: {"us-east/*": 90, "eu-west/*": 10}}]
        """
    )
    client = _client("127.0.6.1", "us-east.zone1.a")
    for extra, weights in (
        (rule, {"us-east": 90, "eu-west": 10}),
        ("", {"us-east": 0, "eu-west": 0}),
    ):
        ctx = GenContext(
            MeshIndex(mesh_config(service("geo", "geo"), GEO, extra), []), ResourceCache()
        )
        found = GENERATORS[CLUSTER_TYPE](ctx, client)[GEO_CLA]
        cluster = Cluster.FromString(AnyProto.FromString(found.any_bytes).value)
        weighted = cluster.common_lb_config.HasField("locality_weighted_lb_config")
        assert weighted is bool(extra)
        cla = ClusterLoadAssignment.FromString(
            AnyProto.FromString(GENERATORS[ENDPOINT_TYPE](ctx, client)[GEO_CLA].any_bytes).value
        )
        assert {e.locality.region: e.load_balancing_weight.value for e in cla.endpoints} == weights


def test_an_endpoint_change_patches_each_locality_assignment() -> None:
    cfg = mesh_config(service("geo", "geo"), GEO, FAILOVER)
    ctx = GenContext(MeshIndex(cfg, []), ResourceCache())
    east, west = _client("127.0.6.1", "us-east.zone1.a"), _client("127.0.6.2", "eu-west.zone1.b")
    for client in (east, west):
        _assignment(ctx, client)
    moved = dataclasses.replace(
        cfg,
        workload_entries=tuple(
            dataclasses.replace(w, address="127.0.5.9") if w.name == "near" else w
            for w in cfg.workload_entries
        ),
    )
    ctx = next_context(ctx, ctx.index.next(moved))
    assert ctx.changed is not None  # an incremental push: the sets are patched
    fresh = GenContext(MeshIndex(moved, []), ResourceCache())
    for client, own in ((east, "us-east"), (west, "eu-west")):
        priorities, patched = _assignment(ctx, client)
        assert priorities[own] == 0
        assert patched == _assignment(fresh, client)[1]
    cla = ClusterLoadAssignment.FromString(AnyProto.FromString(_assignment(ctx, east)[1]).value)
    near = [e for e in cla.endpoints if e.locality.region == "us-east"]
    assert [ep.endpoint.address.socket_address.address for ep in near[0].lb_endpoints] == [
        "127.0.5.9"
    ]


def test_a_grpc_assignment_keeps_priorities_without_gaps() -> None:
    groups = (
        ("r/a", 0, 0, (("10.0.2.1", 80, 3, "r/a", False), ("10.0.2.2", 80, 0, "r/a", False))),
        ("r/b", 1, 0, (("backend.example", 80, 0, "r/b", False),)),  # no IP: left out
        ("s/c", 2, 7, (("10.0.2.3", 80, 0, "s/c", False), ("10.0.2.1", 80, 0, "s/c", False))),
    )
    cla = build_grouped_assignment("c", groups)
    assert [
        (g.locality.region, g.priority, g.load_balancing_weight.value) for g in cla.endpoints
    ] == [
        ("r", 0, 4),  # its endpoints' weights: 3 + 1
        ("s", 1, 7),  # priority 2 moved up: gRPC rejects a sparse list
    ]
    # An address stands once in the whole assignment.
    assert [e.endpoint.address.socket_address.address for e in cla.endpoints[1].lb_endpoints] == [
        "10.0.2.3"
    ]
