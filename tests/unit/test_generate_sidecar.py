"""Generators for Envoy sidecars in interception mode NONE: what each xDS type contains for a
hand-built mesh, and that resources are serialized once per version and shared (rule 8)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

import pytest
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.core.v3.base_pb2 import TrafficDirection
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from envoy.extensions.clusters.dns.v3.dns_cluster_pb2 import DnsCluster
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)
from envoy.extensions.filters.network.tcp_proxy.v3.tcp_proxy_pb2 import TcpProxy
from envoy.extensions.upstreams.http.v3.http_protocol_options_pb2 import HttpProtocolOptions
from google.protobuf import any_pb2
from google.protobuf.message import Message

from control.generate import (
    GENERATORS,
    clusters,
    endpoints,
    listeners_explicit,
    listeners_redirect,
    names,
    peers,
    probes,
    route_tables,
)
from control.generate.addresses import Upstream, parse_default_endpoint
from control.generate.context import GenContext
from control.generate.resource_names import CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE
from control.generate.warn import warn_once
from control.model.index import MeshIndex
from control.model.proxy import Proxy, proxy_from_node
from control.model.types import (
    EgressListener,
    IngressListener,
    MeshConfig,
    Protocol,
    Resolution,
    Service,
    ServicePort,
    SidecarPort,
    SidecarScope,
    SourceRef,
    Workload,
    WorkloadEndpointSpec,
    labels_of,
)
from control.xds.cache import Resource, ResourceCache, ResourceSet
from protos.typeurls import NAME_TABLE, PEER_TABLE, WORKLOAD_PROBE

M = TypeVar("M", bound=Message)


# --- the mesh --------------------------------------------------------------------------------


def kube_service(name: str, ns: str, *ports: ServicePort, app: str | None = None) -> Service:
    return Service(
        hostname=f"{name}.{ns}.svc.cluster.local",
        namespace=ns,
        name=name,
        ports=ports,
        source=SourceRef("Service", ns, name),
        selector=labels_of({"app": app or name}),
    )


def workload(name: str, ns: str, address: str, app: str, **kw: Any) -> Workload:
    return Workload(
        name=name,
        namespace=ns,
        address=address,
        labels=labels_of({"app": app}),
        service_account=app,
        source=SourceRef("WorkloadEntry", ns, name),
        **kw,
    )


def mesh(*, reviews_2_address: str = "127.0.2.2", extra: Iterable[Service] = ()) -> MeshConfig:
    services = (
        kube_service("reviews", "default", ServicePort("http", 9080, Protocol.HTTP, 8080)),
        kube_service("ratings", "default", ServicePort("http", 9080, Protocol.HTTP)),
        kube_service("greeter", "default", ServicePort("grpc", 50051, Protocol.GRPC)),
        kube_service("db", "default", ServicePort("mysql", 3306, Protocol.TCP)),
        kube_service("cache", "default", ServicePort("redis", 3306, Protocol.TCP)),
        kube_service("empty", "default", ServicePort("http", 9080, Protocol.HTTP)),
        kube_service("backend", "other", ServicePort("http", 9080, Protocol.HTTP)),
        Service(
            hostname="api.example.com",
            namespace="external",
            name="api",
            ports=(ServicePort("https", 443, Protocol.TLS),),
            source=SourceRef("ServiceEntry", "external", "api"),
            registry="External",
            resolution=Resolution.DNS,
            mesh_external=True,
        ),
        Service(
            hostname="legacy.corp",
            namespace="external",
            name="legacy",
            ports=(ServicePort("http", 8000, Protocol.HTTP),),
            source=SourceRef("ServiceEntry", "external", "legacy"),
            registry="External",
            resolution=Resolution.STATIC,
            addresses=("240.0.0.10",),
            static_endpoints=(
                WorkloadEndpointSpec("10.1.0.5", locality="eu-west/zone-b", weight=2),
            ),
        ),
        *extra,
    )
    entries = (
        workload(
            "reviews-1", "default", "127.0.2.1", "reviews", locality="us-east/a/rack1", weight=3
        ),
        workload("reviews-2", "default", reviews_2_address, "reviews"),
        workload("ratings-1", "default", "127.0.2.3", "ratings"),
        workload("greeter-1", "default", "127.0.2.4", "greeter"),
        workload("db-1", "default", "127.0.2.5", "db"),
    )
    client_sidecar = SidecarScope(
        namespace="default",
        name="client",
        source=SourceRef("Sidecar", "default", "client"),
        workload_selector=labels_of({"app": "client"}),
        ingress=(
            IngressListener(
                SidecarPort(8000, Protocol.HTTP, "http"), default_endpoint="0.0.0.0:18000"
            ),
            # Same port as the db/cache services: this inbound listener wins over outbound 3306.
            IngressListener(
                SidecarPort(3306, Protocol.TCP, "tcp"), default_endpoint="127.0.0.1:13306"
            ),
            IngressListener(
                SidecarPort(7000, Protocol.TCP, "uds"), default_endpoint="unix:///tmp/app.sock"
            ),
        ),
        egress=(
            EgressListener(("./*",), port=SidecarPort(50051, Protocol.GRPC), bind="127.0.1.50"),
            EgressListener(("./*", "external/api.example.com")),
        ),
    )
    return MeshConfig(services=services, workload_entries=entries, sidecars=(client_sidecar,))


def client(ip: str = "127.0.1.1", pod: str = "client") -> Proxy:
    return proxy_from_node(
        f"sidecar~{ip}~{pod}.default~default.svc.cluster.local", {"LABELS": {"app": "client"}}
    )


def server() -> Proxy:
    return proxy_from_node(
        "sidecar~127.0.1.2~backend-0.other~other.svc.cluster.local", {"LABELS": {"app": "backend"}}
    )


def context(config: MeshConfig, cache: ResourceCache | None = None, *proxies: Proxy) -> GenContext:
    registered = [p.as_workload() for p in proxies]
    return GenContext(
        MeshIndex(config, registered), cache if cache is not None else ResourceCache()
    )


def decode(resource: Resource, cls: type[M]) -> M:
    wrapped = any_pb2.Any()
    wrapped.ParseFromString(resource.any_bytes)
    msg: M = cls()
    assert wrapped.Unpack(msg), wrapped.type_url
    return msg


def decode_all(resources: ResourceSet, cls: type[M]) -> dict[str, M]:
    """Decode a set, checking that each resource is filed under the name it carries."""
    out = {name: decode(res, cls) for name, res in resources.items()}
    name_field = "cluster_name" if cls is ClusterLoadAssignment else "name"
    assert {name: getattr(msg, name_field) for name, msg in out.items()} == {n: n for n in out}
    return out


@pytest.fixture(autouse=True)
def _fresh_warnings() -> None:
    # Warnings are logged once per process; tests that look for one must not depend on order.
    warn_once.clear()


@pytest.fixture
def both() -> tuple[GenContext, Proxy, Proxy]:
    c, s = client(), server()
    return context(mesh(), None, c, s), c, s


def cluster_names(ctx: GenContext, proxy: Proxy) -> set[str]:
    return set(clusters.generate(ctx, proxy))


# --- CDS -------------------------------------------------------------------------------------


def test_clusters_of_a_scoped_client(both: tuple[GenContext, Proxy, Proxy]) -> None:
    ctx, proxy, _ = both
    got = decode_all(clusters.generate(ctx, proxy), Cluster)
    assert set(got) == {
        "BlackHoleCluster",
        "PassthroughCluster",
        "outbound|443||api.example.com",
        "outbound|3306||cache.default.svc.cluster.local",
        "outbound|3306||db.default.svc.cluster.local",
        "outbound|9080||empty.default.svc.cluster.local",
        "outbound|50051||greeter.default.svc.cluster.local",
        "outbound|9080||ratings.default.svc.cluster.local",
        "outbound|9080||reviews.default.svc.cluster.local",
        "inbound|8000||",
        "inbound|3306||",
        "inbound|7000||",
    }, "Sidecar egress ./* + external/api.example.com hides backend.other and legacy.corp"

    reviews = got["outbound|9080||reviews.default.svc.cluster.local"]
    assert reviews.type == Cluster.EDS
    assert reviews.eds_cluster_config.eds_config.HasField("ads")
    assert reviews.connect_timeout.seconds == 10
    assert reviews.lb_policy == Cluster.ROUND_ROBIN
    assert not reviews.typed_extension_protocol_options

    greeter = got["outbound|50051||greeter.default.svc.cluster.local"]
    options = HttpProtocolOptions()
    key = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    assert greeter.typed_extension_protocol_options[key].Unpack(options)
    assert options.explicit_http_config.HasField("http2_protocol_options")

    api = got["outbound|443||api.example.com"]
    assert api.WhichOneof("cluster_discovery_type") == "cluster_type"
    assert api.cluster_type.name == "envoy.cluster.dns"
    dns = DnsCluster()
    assert api.cluster_type.typed_config.Unpack(dns)
    assert not dns.all_addresses_in_single_endpoint, "strict DNS: every address is a host"
    assert dns.respect_dns_ttl
    [group] = api.load_assignment.endpoints
    [lb] = group.lb_endpoints
    assert lb.endpoint.address.socket_address.address == "api.example.com"
    assert lb.endpoint.address.socket_address.port_value == 443

    def target(name: str) -> str:
        [lb] = got[name].load_assignment.endpoints[0].lb_endpoints
        addr = lb.endpoint.address
        if addr.HasField("pipe"):
            return f"unix://{addr.pipe.path}"
        return f"{addr.socket_address.address}:{addr.socket_address.port_value}"

    assert got["inbound|8000||"].type == Cluster.STATIC
    assert target("inbound|8000||") == "127.0.1.1:18000", "0.0.0.0 means the app at the pod IP"
    assert target("inbound|3306||") == "127.0.0.1:13306"
    assert target("inbound|7000||") == "unix:///tmp/app.sock"

    assert got["BlackHoleCluster"].type == Cluster.STATIC
    assert got["PassthroughCluster"].type == Cluster.ORIGINAL_DST


def test_unscoped_proxy_sees_everything_and_has_no_inbound(
    both: tuple[GenContext, Proxy, Proxy],
) -> None:
    ctx, _, proxy = both
    names = cluster_names(ctx, proxy)
    assert "outbound|9080||backend.other.svc.cluster.local" in names
    assert "outbound|8000||legacy.corp" in names
    assert not any(n.startswith("inbound|") for n in names)


def test_dns_service_entry_with_endpoints_resolves_them() -> None:
    entry = Service(
        hostname="*.wiki.example",
        namespace="external",
        name="wiki",
        ports=(ServicePort("http", 80, Protocol.HTTP),),
        source=SourceRef("ServiceEntry", "external", "wiki"),
        registry="External",
        resolution=Resolution.DNS,
        static_endpoints=(WorkloadEndpointSpec("wiki.internal"), WorkloadEndpointSpec("10.9.0.1")),
    )
    lone = dataclasses.replace(entry, hostname="*.nothing.example", static_endpoints=())
    ctx = context(mesh(extra=(entry, lone)))
    got = decode_all(clusters.generate(ctx, server()), Cluster)
    wiki = got["outbound|80||*.wiki.example"]
    assert wiki.cluster_type.name == "envoy.cluster.dns"
    addrs = [
        lb.endpoint.address.socket_address.address
        for group in wiki.load_assignment.endpoints
        for lb in group.lb_endpoints
    ]
    assert addrs == ["10.9.0.1", "wiki.internal"]
    # A wildcard host with nothing to resolve cannot be a DNS cluster.
    assert got["outbound|80||*.nothing.example"].type == Cluster.EDS
    assert "outbound|80||*.nothing.example" in endpoints.generate(ctx, server())


# --- EDS -------------------------------------------------------------------------------------


def test_every_eds_cluster_has_a_load_assignment(both: tuple[GenContext, Proxy, Proxy]) -> None:
    ctx, *proxies = both
    for proxy in proxies:
        eds_clusters = {
            name
            for name, c in decode_all(clusters.generate(ctx, proxy), Cluster).items()
            if c.type == Cluster.EDS
        }
        assert set(endpoints.generate(ctx, proxy)) == eds_clusters


def test_load_assignments(both: tuple[GenContext, Proxy, Proxy]) -> None:
    ctx, proxy, other = both
    got = decode_all(endpoints.generate(ctx, proxy), ClusterLoadAssignment)

    reviews = got["outbound|9080||reviews.default.svc.cluster.local"]
    by_locality = {
        (g.locality.region, g.locality.zone, g.locality.sub_zone): [
            (
                lb.endpoint.address.socket_address.address,
                lb.endpoint.address.socket_address.port_value,
                lb.load_balancing_weight.value if lb.HasField("load_balancing_weight") else None,
            )
            for lb in g.lb_endpoints
        ]
        for g in reviews.endpoints
    }
    assert by_locality == {
        ("", "", ""): [("127.0.2.2", 8080, None)],
        ("us-east", "a", "rack1"): [("127.0.2.1", 8080, 3)],
    }, "targetPort 8080, weight only when set, locality region/zone/subzone"

    assert not got["outbound|9080||empty.default.svc.cluster.local"].endpoints
    assert "outbound|443||api.example.com" not in got, "DNS clusters carry their own endpoints"

    theirs = decode_all(endpoints.generate(ctx, other), ClusterLoadAssignment)
    backend = theirs["outbound|9080||backend.other.svc.cluster.local"]
    [group] = backend.endpoints
    assert [lb.endpoint.address.socket_address.address for lb in group.lb_endpoints] == [
        "127.0.1.2"
    ], "a connected proxy registers itself as a workload"
    legacy = theirs["outbound|8000||legacy.corp"]
    assert legacy.endpoints[0].locality.region == "eu-west"
    assert legacy.endpoints[0].lb_endpoints[0].load_balancing_weight.value == 2


def test_eds_leaves_out_hostnames() -> None:
    config = mesh()
    config = dataclasses.replace(
        config,
        workload_entries=(
            *config.workload_entries,
            workload("ratings-dns", "default", "ratings.vm.example", "ratings"),
        ),
    )
    ctx = context(config)
    cla = decode(
        endpoints.generate(ctx, client())["outbound|9080||ratings.default.svc.cluster.local"],
        ClusterLoadAssignment,
    )
    addrs = [lb.endpoint.address.socket_address.address for lb in cla.endpoints[0].lb_endpoints]
    assert addrs == ["127.0.2.3"]


# --- LDS -------------------------------------------------------------------------------------


def hcm_of(listener: Listener) -> HttpConnectionManager:
    [chain] = listener.filter_chains
    [f] = chain.filters
    assert f.name == "envoy.filters.network.http_connection_manager"
    hcm = HttpConnectionManager()
    assert f.typed_config.Unpack(hcm)
    return hcm


def tcp_of(chain: Any) -> TcpProxy:
    [f] = chain.filters
    assert f.name == "envoy.filters.network.tcp_proxy"
    proxy = TcpProxy()
    assert f.typed_config.Unpack(proxy)
    return proxy


def bound(listener: Listener) -> str:
    sa = listener.address.socket_address
    return f"{sa.address}:{sa.port_value}"


def test_listeners_of_a_scoped_client(
    both: tuple[GenContext, Proxy, Proxy], caplog: pytest.LogCaptureFixture
) -> None:
    ctx, proxy, _ = both
    got = decode_all(listeners_explicit.generate(ctx, proxy), Listener)
    assert {name: bound(lst) for name, lst in got.items()} == {
        "127.0.1.1_9080": "127.0.1.1:9080",
        "127.0.1.50_50051": "127.0.1.50:50051",  # egress listener bind for that port
        "127.0.1.1_443": "127.0.1.1:443",
        "127.0.1.1_8000": "127.0.1.1:8000",
        "127.0.1.1_3306": "127.0.1.1:3306",  # the inbound one: outbound 3306 yields
        "127.0.1.1_7000": "127.0.1.1:7000",
    }
    assert "outbound listener 127.0.1.1:3306 skipped" in caplog.text

    http = got["127.0.1.1_9080"]
    assert http.traffic_direction == TrafficDirection.OUTBOUND
    hcm = hcm_of(http)
    assert hcm.stat_prefix == "outbound_127.0.1.1_9080"
    assert hcm.codec_type == HttpConnectionManager.AUTO
    assert hcm.rds.route_config_name == "9080"
    assert hcm.rds.config_source.HasField("ads")
    assert hcm.http_filters[-1].name == "envoy.filters.http.router"
    assert hcm.use_remote_address.value is False
    assert hcm.normalize_path.value is True
    assert [u.upgrade_type for u in hcm.upgrade_configs] == ["websocket"]
    assert hcm_of(got["127.0.1.50_50051"]).rds.route_config_name == "50051"

    tls = got["127.0.1.1_443"]
    [chain] = tls.filter_chains
    assert list(chain.filter_chain_match.server_names) == ["api.example.com"]
    assert tcp_of(chain).cluster == "outbound|443||api.example.com"
    assert [f.name for f in tls.listener_filters] == ["envoy.filters.listener.tls_inspector"]

    inbound_http = got["127.0.1.1_8000"]
    assert inbound_http.traffic_direction == TrafficDirection.INBOUND
    route_config = hcm_of(inbound_http).route_config
    assert route_config.name == "inbound|8000||"
    [vhost] = route_config.virtual_hosts
    assert vhost.name == "inbound|http|8000"
    assert list(vhost.domains) == ["*"]
    assert vhost.routes[0].route.cluster == "inbound|8000||"

    inbound_tcp = got["127.0.1.1_3306"]
    assert inbound_tcp.traffic_direction == TrafficDirection.INBOUND
    assert tcp_of(inbound_tcp.filter_chains[0]).cluster == "inbound|3306||"


def test_tcp_services_sharing_a_port_first_by_hostname_binds(
    both: tuple[GenContext, Proxy, Proxy],
) -> None:
    ctx, _, proxy = both
    got = decode_all(listeners_explicit.generate(ctx, proxy), Listener)
    [chain] = got["127.0.1.2_3306"].filter_chains
    assert not chain.HasField("filter_chain_match")
    assert tcp_of(chain).cluster == "outbound|3306||cache.default.svc.cluster.local"
    assert not any(n.startswith("0.0.0.0") for n in got)
    # Every cluster a listener names exists in CDS.
    names = cluster_names(ctx, proxy)
    for lst in got.values():
        for ch in lst.filter_chains:
            if ch.filters[0].name == "envoy.filters.network.tcp_proxy":
                assert tcp_of(ch).cluster in names


# --- RDS -------------------------------------------------------------------------------------


def vhosts(ctx: GenContext, proxy: Proxy, port: str) -> dict[str, list[str]]:
    rc = decode(route_tables.generate(ctx, proxy)[port], RouteConfiguration)
    assert rc.validate_clusters.value is False
    for vh in rc.virtual_hosts:
        [route] = vh.routes
        assert route.match.prefix == "/"
        assert (
            route.route.cluster
            == "outbound|" + vh.name.rpartition(":")[2] + "||" + (vh.name.rpartition(":")[0])
        )
        assert route.route.HasField("timeout") and route.route.timeout.seconds == 0
    return {vh.name: list(vh.domains) for vh in rc.virtual_hosts}


def test_routes_domains_follow_the_client_namespace(both: tuple[GenContext, Proxy, Proxy]) -> None:
    ctx, proxy, other = both
    assert set(route_tables.generate(ctx, proxy)) == {"9080", "50051"}
    mine = vhosts(ctx, proxy, "9080")
    assert list(mine) == [
        "empty.default.svc.cluster.local:9080",
        "ratings.default.svc.cluster.local:9080",
        "reviews.default.svc.cluster.local:9080",
    ]
    assert mine["reviews.default.svc.cluster.local:9080"] == [
        "reviews.default.svc.cluster.local",
        "reviews.default.svc.cluster.local:9080",
        "reviews.default.svc",
        "reviews.default.svc:9080",
        "reviews.default",
        "reviews.default:9080",
        "reviews",
        "reviews:9080",
    ]
    theirs = vhosts(ctx, other, "9080")
    assert "backend" in theirs["backend.other.svc.cluster.local:9080"]
    assert "reviews" not in theirs["reviews.default.svc.cluster.local:9080"]
    assert "reviews.default" in theirs["reviews.default.svc.cluster.local:9080"]
    legacy = vhosts(ctx, other, "8000")["legacy.corp:8000"]
    assert legacy == ["legacy.corp", "legacy.corp:8000", "240.0.0.10", "240.0.0.10:8000"]


def test_routes_never_repeat_a_domain() -> None:
    clash = Service(
        hostname="reviews.default",
        namespace="default",
        name="reviews-alias",
        ports=(ServicePort("http", 9080, Protocol.HTTP),),
        source=SourceRef("ServiceEntry", "default", "reviews-alias"),
        registry="External",
    )
    ctx = context(mesh(extra=(clash,)))
    got = vhosts(ctx, client(), "9080")
    assert got["reviews.default:9080"] == ["reviews.default", "reviews.default:9080"]
    assert "reviews.default" not in got["reviews.default.svc.cluster.local:9080"]
    all_domains = [d.lower() for ds in got.values() for d in ds]
    assert len(all_domains) == len(set(all_domains))


# --- helpers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0.0.0.0:8080", Upstream("10.0.0.7", 8080)),
        ("127.0.0.1:8080", Upstream("127.0.0.1", 8080)),
        ("[::1]:8080", Upstream("::1", 8080)),
        ("unix:///var/run/app.sock", Upstream(pipe="/var/run/app.sock")),
        ("", Upstream("127.0.0.1", 9000)),
        ("localhost:8080", None),
        ("127.0.0.1", None),
        ("127.0.0.1:99999", None),
        ("unix://", None),
    ],
)
def test_parse_default_endpoint(value: str, expected: Upstream | None) -> None:
    assert parse_default_endpoint(value, "10.0.0.7", 9000) == expected


def test_ingress_forwarding_to_itself_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    config = mesh()
    [sidecar] = config.sidecars
    looping = dataclasses.replace(
        sidecar,
        ingress=(
            IngressListener(SidecarPort(8001, Protocol.HTTP), default_endpoint="0.0.0.0:8001"),
        ),
    )
    ctx = context(dataclasses.replace(config, sidecars=(looping,)))
    proxy = client(ip="127.0.1.77")
    assert "inbound|8001||" not in clusters.generate(ctx, proxy)
    assert "127.0.1.77_8001" not in listeners_explicit.generate(ctx, proxy)
    assert "forward to its own listener" in caplog.text


def test_generators_table() -> None:
    assert GENERATORS == {
        CLUSTER_TYPE: clusters.generate,
        ENDPOINT_TYPE: endpoints.generate,
        LISTENER_TYPE: listeners_redirect.generate_listeners,  # mode NONE: listeners_explicit
        ROUTE_TYPE: route_tables.generate,
        NAME_TABLE: names.generate,
        WORKLOAD_PROBE: probes.generate,
        PEER_TABLE: peers.generate,
    }


# --- rule 8: serialize once per version, share between proxies ------------------------------


class CountingCache(ResourceCache):
    """ResourceCache that records which cache slots were built, to show what was re-done."""

    def __init__(self) -> None:
        super().__init__()
        self.built: Counter[tuple[str, str, Hashable]] = Counter()

    def get(
        self,
        type_url: str,
        name: str,
        key: Hashable,
        build: Callable[[], Message],
        variant: Hashable = None,
    ) -> Resource:
        def counted() -> Message:
            self.built[(type_url, name, variant)] += 1
            return build()

        return super().get(type_url, name, key, counted, variant)


def generate_all(
    config: MeshConfig, cache: ResourceCache, proxies: list[Proxy]
) -> dict[str, dict[str, ResourceSet]]:
    cache.next_generation()
    ctx = context(config, cache, *proxies)
    return {p.id: {t: gen(ctx, p) for t, gen in GENERATORS.items()} for p in proxies}


def test_fifty_proxies_share_serialized_resources() -> None:
    proxies = [client(ip=f"127.0.1.{i}", pod=f"client-{i}") for i in range(1, 51)]
    cache = CountingCache()
    out = generate_all(mesh(), cache, proxies)

    assert set(cache.built.values()) == {1}, "no cache slot is built twice in a push"
    distinct = {
        (t, res.name, res.version)
        for sets in out.values()
        for t, rs in sets.items()
        for res in rs.values()
    }
    assert cache.serializations == len(distinct)

    per_type = Counter(t for t, *_ in cache.built)
    assert per_type[ENDPOINT_TYPE] == 6  # each outbound EDS cluster once, not once per proxy
    assert per_type[ROUTE_TYPE] == 2  # "9080" and "50051", shared by all 50
    # Outbound clusters, the two fixed ones and the inbound clusters that point at 127.0.0.1
    # and a Unix socket are shared; inbound|8000|| points at each pod's own IP.
    assert per_type[CLUSTER_TYPE] == 7 + 2 + 2 + 50
    # Listeners are bound to each pod's IP, except the egress listener with a fixed bind.
    assert per_type[LISTENER_TYPE] == 50 * 5 + 1

    first = out[proxies[0].id]
    for p in proxies[1:]:
        assert out[p.id][ENDPOINT_TYPE] is first[ENDPOINT_TYPE], "one set per scope"
        assert out[p.id][ROUTE_TYPE] is first[ROUTE_TYPE]
        assert out[p.id][CLUSTER_TYPE]["inbound|3306||"] == first[CLUSTER_TYPE]["inbound|3306||"]

    # Same inputs in a new push: nothing is serialized again.
    before = cache.serializations
    again = generate_all(mesh(), cache, proxies)
    assert cache.serializations == before
    assert {p: {t: rs.digest for t, rs in s.items()} for p, s in again.items()} == {
        p: {t: rs.digest for t, rs in s.items()} for p, s in out.items()
    }

    # One endpoint moves: exactly that CLA is rebuilt, once for all 50 proxies.
    cache.built.clear()
    moved = generate_all(mesh(reviews_2_address="127.0.2.9"), cache, proxies)
    reviews = "outbound|9080||reviews.default.svc.cluster.local"
    assert cache.built == Counter({(ENDPOINT_TYPE, reviews, None): 1})
    assert cache.serializations == before + 1
    for p in proxies:
        changed = {t for t in GENERATORS if moved[p.id][t].digest != out[p.id][t].digest}
        assert changed == {ENDPOINT_TYPE}
        assert (
            moved[p.id][ENDPOINT_TYPE][reviews].version != out[p.id][ENDPOINT_TYPE][reviews].version
        )


def test_namespaces_without_local_services_on_a_port_share_route_bytes() -> None:
    a = proxy_from_node("sidecar~127.0.4.1~a.ns-a~ns-a.svc.cluster.local", {})
    b = proxy_from_node("sidecar~127.0.4.2~b.ns-b~ns-b.svc.cluster.local", {})
    cache = CountingCache()
    out = generate_all(mesh(), cache, [a, b, server()])
    assert out[a.id][ROUTE_TYPE]["9080"] == out[b.id][ROUTE_TYPE]["9080"]
    assert out[a.id][ROUTE_TYPE]["9080"] != out[server().id][ROUTE_TYPE]["9080"]
    assert set(cache.built.values()) == {1}


def test_output_is_deterministic() -> None:
    proxies = [client(), server()]
    one = generate_all(mesh(), ResourceCache(), proxies)
    two = generate_all(mesh(), ResourceCache(), list(reversed(proxies)))
    for p in proxies:
        for t in GENERATORS:
            assert {n: r.any_bytes for n, r in one[p.id][t].items()} == {
                n: r.any_bytes for n, r in two[p.id][t].items()
            }
