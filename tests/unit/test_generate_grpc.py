"""Generators for proxyless gRPC clients (GENERATOR=grpc): what each xDS type contains, the
constraints gRPC's xDS client puts on it, Sidecar scoping, and rule 8 (serialize once, share)."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.core.v3.health_check_pb2 import HealthStatus
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from envoy.extensions.filters.http.router.v3.router_pb2 import Router
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)

from control.generate import (
    GENERATORS,
    GRPC_GENERATORS,
    generators_for,
    grpc_clusters,
    grpc_listeners,
    grpc_targets,
    names,
    probes,
)
from control.generate.context import GenContext
from control.generate.resource_names import CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE
from control.generate.warn import warn_once
from control.model.proxy import Proxy, proxy_from_node
from control.model.types import (
    MeshConfig,
    Protocol,
    Resolution,
    Service,
    ServicePort,
    SourceRef,
    WorkloadEndpointSpec,
)
from control.xds.cache import ResourceCache, ResourceSet
from protos.typeurls import NAME_TABLE, WORKLOAD_PROBE
from tests.unit.test_generate_sidecar import (
    CountingCache,
    client,
    context,
    decode,
    decode_all,
    kube_service,
    mesh,
    workload,
)

FQDN = "svc.cluster.local"


def grpc_client(ns: str = "default", *, ip: str = "127.0.3.1", app: str = "client") -> Proxy:
    return proxy_from_node(
        f"sidecar~{ip}~grpc-{app}.{ns}~{ns}.{FQDN}",
        {"GENERATOR": "grpc", "LABELS": {"app": app}, "AUTO_REGISTER": "false"},
    )


def external(name: str, host: str, port: ServicePort, **kw: object) -> Service:
    return Service(
        hostname=host,
        namespace="external",
        name=name,
        ports=(port,),
        source=SourceRef("ServiceEntry", "external", name),
        registry="External",
        **kw,  # type: ignore[arg-type]
    )


def grpc_mesh(**kw: object) -> MeshConfig:
    """The Envoy tests' mesh plus what only gRPC cares about: an unnamed (UNKNOWN) port, DNS
    ServiceEntries with one and with several endpoints, and a wildcard host."""
    extra = (
        kube_service("plain", "default", ServicePort("", 7070, Protocol.UNKNOWN, 8070)),
        external(
            "search",
            "search.example.com",
            ServicePort("grpc", 443, Protocol.GRPC),
            resolution=Resolution.DNS,
        ),
        external(
            "mirrors",
            "mirrors.example.com",
            ServicePort("http", 80, Protocol.HTTP),
            resolution=Resolution.DNS,
            static_endpoints=(
                WorkloadEndpointSpec("b.mirrors.example.com"),
                WorkloadEndpointSpec("a.mirrors.example.com", ports=(("http", 8080),)),
            ),
        ),
        external(
            "wiki",
            "*.wiki.example",
            ServicePort("http", 80, Protocol.HTTP),
            resolution=Resolution.DNS,
            static_endpoints=(WorkloadEndpointSpec("wiki.internal"),),
        ),
    )
    return mesh(extra=extra, **kw)  # type: ignore[arg-type]


def generate(ctx: GenContext, proxy: Proxy) -> dict[str, ResourceSet]:
    return {t: gen(ctx, proxy) for t, gen in GRPC_GENERATORS.items()}


def hcm_of(listener: Listener) -> HttpConnectionManager:
    hcm = HttpConnectionManager()
    assert listener.api_listener.api_listener.Unpack(hcm)
    return hcm


def cluster_of(rc: RouteConfiguration) -> str:
    [vhost] = rc.virtual_hosts
    [route] = vhost.routes
    return str(route.route.cluster)


@pytest.fixture(autouse=True)
def _fresh_warnings() -> None:
    warn_once.clear()


# --- LDS -------------------------------------------------------------------------------------


def test_listener_names_are_every_name_a_client_may_dial() -> None:
    ctx = context(grpc_mesh())
    names = set(grpc_listeners.generate_listeners(ctx, grpc_client("other")))
    forms = ["{s}.{ns}.svc.cluster.local", "{s}.{ns}.svc", "{s}.{ns}"]

    def all_forms(svc: str, ns: str, port: int, *, short: bool) -> set[str]:
        hosts = [f.format(s=svc, ns=ns) for f in forms] + ([svc] if short else [])
        return {f"{h}:{port}" for h in hosts}

    assert names == (
        all_forms("reviews", "default", 9080, short=False)
        | all_forms("ratings", "default", 9080, short=False)
        | all_forms("empty", "default", 9080, short=False)
        | all_forms("greeter", "default", 50051, short=False)
        | all_forms("plain", "default", 7070, short=False)
        | all_forms("backend", "other", 9080, short=True)  # bare name: client's namespace only
        | {
            "legacy.corp:8000",  # a ServiceEntry host is dialled as it is
            "search.example.com:443",
            "mirrors.example.com:80",
        }
    ), "no TCP/TLS ports (db, cache, api.example.com), no wildcard host"


def test_listener_is_an_api_listener_with_rds_and_router_last() -> None:
    ctx = context(grpc_mesh())
    got = decode_all(grpc_listeners.generate_listeners(ctx, grpc_client()), Listener)
    for name, listener in got.items():
        assert listener.HasField("api_listener"), name
        assert not listener.HasField("address"), "nothing is bound"
        assert not listener.filter_chains and not listener.listener_filters
        hcm = hcm_of(listener)
        assert hcm.WhichOneof("route_specifier") == "rds"
        assert hcm.rds.route_config_name == name
        assert hcm.rds.config_source.HasField("ads")
        router = hcm.http_filters[-1]
        assert router.name == "envoy.filters.http.router"
        assert router.typed_config.Is(Router.DESCRIPTOR)
        assert len(hcm.http_filters) == 1


# --- RDS -------------------------------------------------------------------------------------


def test_each_listener_has_its_route_to_the_service_cluster() -> None:
    ctx = context(grpc_mesh())
    proxy = grpc_client()
    routes = decode_all(grpc_listeners.generate_routes(ctx, proxy), RouteConfiguration)
    assert set(routes) == set(grpc_listeners.generate_listeners(ctx, proxy))
    clusters = set(grpc_clusters.generate_clusters(ctx, proxy))
    for name, rc in routes.items():
        [vhost] = rc.virtual_hosts
        assert list(vhost.domains) == ["*"]
        [route] = vhost.routes
        assert route.match.prefix == "/"
        assert route.route.cluster in clusters, name
    assert cluster_of(routes["reviews:9080"]) == "outbound|9080||reviews.default.svc.cluster.local"
    assert cluster_of(routes["plain.default.svc:7070"]) == (
        "outbound|7070||plain.default.svc.cluster.local"
    )


def test_short_name_follows_the_client_namespace() -> None:
    twin = kube_service("reviews", "other", ServicePort("http", 9080, Protocol.HTTP))
    ctx = context(_with(grpc_mesh(), twin))
    mine = decode(
        grpc_listeners.generate_routes(ctx, grpc_client())["reviews:9080"], RouteConfiguration
    )
    theirs = decode(
        grpc_listeners.generate_routes(ctx, grpc_client("other"))["reviews:9080"],
        RouteConfiguration,
    )
    assert cluster_of(mine) == "outbound|9080||reviews.default.svc.cluster.local"
    assert cluster_of(theirs) == "outbound|9080||reviews.other.svc.cluster.local"


def test_a_name_two_services_answer_to_goes_to_the_one_it_names(
    caplog: pytest.LogCaptureFixture,
) -> None:
    alias = Service(
        hostname="reviews.default",
        namespace="default",
        name="reviews-alias",
        ports=(ServicePort("http", 9080, Protocol.HTTP),),
        source=SourceRef("ServiceEntry", "default", "reviews-alias"),
        registry="External",
    )
    ctx = context(_with(grpc_mesh(), alias))
    routes = decode_all(grpc_listeners.generate_routes(ctx, grpc_client()), RouteConfiguration)
    assert cluster_of(routes["reviews.default:9080"]) == "outbound|9080||reviews.default"
    assert cluster_of(routes["reviews:9080"]) == "outbound|9080||reviews.default.svc.cluster.local"
    assert "gRPC listener reviews.default:9080" in caplog.text


# --- CDS -------------------------------------------------------------------------------------


def test_clusters_are_eds_over_ads_round_robin() -> None:
    ctx = context(grpc_mesh())
    got = decode_all(grpc_clusters.generate_clusters(ctx, grpc_client("other")), Cluster)
    reviews = got["outbound|9080||reviews.default.svc.cluster.local"]
    assert reviews.type == Cluster.EDS
    assert reviews.eds_cluster_config.eds_config.HasField("ads")
    assert reviews.eds_cluster_config.service_name == reviews.name
    assert reviews.lb_policy == Cluster.ROUND_ROBIN
    assert "BlackHoleCluster" not in got and "PassthroughCluster" not in got
    assert "outbound|3306||db.default.svc.cluster.local" not in got


def test_dns_service_entries_become_logical_dns(caplog: pytest.LogCaptureFixture) -> None:
    ctx = context(grpc_mesh())
    got = decode_all(grpc_clusters.generate_clusters(ctx, grpc_client("other")), Cluster)

    def target(name: str) -> str:
        cluster = got[name]
        assert cluster.type == Cluster.LOGICAL_DNS
        # gRPC: exactly one locality with exactly one endpoint.
        [group] = cluster.load_assignment.endpoints
        [lb] = group.lb_endpoints
        sa = lb.endpoint.address.socket_address
        return f"{sa.address}:{sa.port_value}"

    assert target("outbound|443||search.example.com") == "search.example.com:443"
    assert target("outbound|80||mirrors.example.com") == "a.mirrors.example.com:8080"
    assert "1 other endpoint(s) left out" in caplog.text
    assert "outbound|80||mirrors.example.com" not in grpc_clusters.generate_endpoints(
        ctx, grpc_client("other")
    )


# --- EDS -------------------------------------------------------------------------------------


def test_every_eds_cluster_has_a_load_assignment() -> None:
    ctx = context(grpc_mesh())
    proxy = grpc_client("other")
    eds = {
        name
        for name, c in decode_all(grpc_clusters.generate_clusters(ctx, proxy), Cluster).items()
        if c.type == Cluster.EDS
    }
    assert set(grpc_clusters.generate_endpoints(ctx, proxy)) == eds


def test_load_assignments_have_weighted_localities(caplog: pytest.LogCaptureFixture) -> None:
    config = grpc_mesh()
    config = dataclasses.replace(
        config,
        workload_entries=(
            *config.workload_entries,
            workload("reviews-3", "default", "127.0.2.7", "reviews"),
            # Same address and port as reviews-2 under another name: said once.
            workload("reviews-2b", "default", "127.0.2.2", "reviews", weight=5),
            workload("reviews-vm", "default", "reviews.vm.example", "reviews"),
            workload("reviews-uds", "default", "unix:///tmp/reviews.sock", "reviews"),
        ),
    )
    ctx = context(config)
    got = decode_all(grpc_clusters.generate_endpoints(ctx, grpc_client()), ClusterLoadAssignment)
    reviews = got["outbound|9080||reviews.default.svc.cluster.local"]
    groups = {}
    for group in reviews.endpoints:
        assert group.HasField("locality"), "gRPC drops a group without a locality"
        loc = group.locality
        groups[(loc.region, loc.zone, loc.sub_zone)] = (
            group.load_balancing_weight.value,
            [
                (
                    lb.endpoint.address.socket_address.address,
                    lb.endpoint.address.socket_address.port_value,
                    lb.load_balancing_weight.value,
                    lb.health_status,
                )
                for lb in group.lb_endpoints
            ],
        )
    healthy = HealthStatus.HEALTHY
    assert groups == {
        ("", "", ""): (2, [("127.0.2.2", 8080, 0, healthy), ("127.0.2.7", 8080, 0, healthy)]),
        ("us-east", "a", "rack1"): (3, [("127.0.2.1", 8080, 3, healthy)]),
    }, "locality weight = sum of endpoint weights (1 when unset); no hostnames or sockets"
    assert "reviews.vm.example is not an IP" in caplog.text

    empty = got["outbound|9080||empty.default.svc.cluster.local"]
    assert empty.cluster_name and not empty.endpoints


# --- scoping ---------------------------------------------------------------------------------


def test_sidecar_egress_scopes_a_grpc_client() -> None:
    ctx = context(grpc_mesh())
    scoped = generate(ctx, grpc_client(app="client"))  # the "client" Sidecar: ./* + one host
    unscoped = generate(ctx, grpc_client(app="other"))
    assert set(scoped[CLUSTER_TYPE]) == {
        f"outbound|{p}||{s}.default.svc.cluster.local"
        for s, p in (
            ("reviews", 9080),
            ("ratings", 9080),
            ("empty", 9080),
            ("greeter", 50051),
            ("plain", 7070),
        )
    }
    assert "outbound|9080||backend.other.svc.cluster.local" in unscoped[CLUSTER_TYPE]
    assert "backend.other:9080" in unscoped[LISTENER_TYPE]
    assert "backend.other:9080" not in scoped[LISTENER_TYPE]
    assert "legacy.corp:8000" not in scoped[ROUTE_TYPE]


# --- dispatch --------------------------------------------------------------------------------


def test_grpc_proxies_get_the_grpc_table() -> None:
    assert GRPC_GENERATORS == {
        CLUSTER_TYPE: grpc_clusters.generate_clusters,
        ENDPOINT_TYPE: grpc_clusters.generate_endpoints,
        LISTENER_TYPE: grpc_listeners.generate_listeners,
        ROUTE_TYPE: grpc_listeners.generate_routes,
        NAME_TABLE: names.generate,  # the agent's DNS table is the same for every proxy kind
        WORKLOAD_PROBE: probes.generate,  # so is its WorkloadGroup probe
    }
    assert generators_for(grpc_client()) is GRPC_GENERATORS
    assert generators_for(client()) is GENERATORS
    proxyless = proxy_from_node(f"proxyless~127.0.3.9~p.default~default.{FQDN}", {})
    assert generators_for(proxyless) is GRPC_GENERATORS


# --- rule 8 ----------------------------------------------------------------------------------


def test_grpc_clients_share_serialized_resources_and_coexist_with_envoys() -> None:
    grpcs = [grpc_client(ip=f"127.0.3.{i}") for i in range(1, 21)]
    grpcs += [grpc_client("other", ip=f"127.0.4.{i}", app="other") for i in range(1, 21)]
    envoys = [client(ip=f"127.0.1.{i}", pod=f"client-{i}") for i in range(1, 4)]
    cache = CountingCache()

    def push(config: MeshConfig) -> dict[str, dict[str, ResourceSet]]:
        cache.next_generation()
        ctx = context(config, cache)
        out = {}
        # Kinds of proxy take turns, which must not make them evict each other's bytes.
        for p in [*grpcs[:20], *envoys, *grpcs[20:]]:
            table = generators_for(p)
            out[p.id] = {t: gen(ctx, p) for t, gen in table.items()}
        return out

    first = push(grpc_mesh())
    assert set(cache.built.values()) == {1}, "no cache slot is built twice in a push"
    same_scope = [p for p in grpcs if p.namespace == "default"]
    for p in same_scope[1:]:
        # NDS is per pod in interception mode NONE (names answer with the pod's own IP).
        for t in set(GRPC_GENERATORS) - {NAME_TABLE}:
            assert first[p.id][t] is first[same_scope[0].id][t], "one set per namespace+scope"

    before = cache.serializations
    again = push(grpc_mesh())
    assert cache.serializations == before, "an unchanged push serializes nothing"
    assert {p: {t: s.digest for t, s in v.items()} for p, v in again.items()} == {
        p: {t: s.digest for t, s in v.items()} for p, v in first.items()
    }

    # One endpoint moves: the gRPC CLA and the Envoy CLA are rebuilt once each.
    cache.built.clear()
    push(grpc_mesh(reviews_2_address="127.0.2.9"))
    reviews = "outbound|9080||reviews.default.svc.cluster.local"
    assert cache.built == Counter(
        {(ENDPOINT_TYPE, reviews, None): 1, (ENDPOINT_TYPE, reviews, grpc_targets.VARIANT): 1}
    )


def test_short_names_in_two_namespaces_keep_their_own_bytes() -> None:
    twin = kube_service("reviews", "other", ServicePort("http", 9080, Protocol.HTTP))
    cache = CountingCache()
    a, b = grpc_client(), grpc_client("other", app="other")
    for _ in range(2):
        cache.next_generation()
        ctx = context(_with(grpc_mesh(), twin), cache)
        ra, rb = grpc_listeners.generate_routes(ctx, a), grpc_listeners.generate_routes(ctx, b)
    assert ra["reviews:9080"].version != rb["reviews:9080"].version
    assert ra["reviews.default:9080"] is rb["reviews.default:9080"], "same content, shared"
    assert set(cache.built.values()) == {1}, "the second push rebuilt nothing"


def test_output_is_deterministic() -> None:
    proxies = [grpc_client(), grpc_client("other", app="other")]
    one = {p.id: generate(context(grpc_mesh(), ResourceCache()), p) for p in proxies}
    two = {p.id: generate(context(grpc_mesh(), ResourceCache()), p) for p in reversed(proxies)}
    for p in proxies:
        for t in GRPC_GENERATORS:
            assert {n: r.any_bytes for n, r in one[p.id][t].items()} == {
                n: r.any_bytes for n, r in two[p.id][t].items()
            }


def _with(config: MeshConfig, *services: Service) -> MeshConfig:
    return dataclasses.replace(config, services=(*config.services, *services))
