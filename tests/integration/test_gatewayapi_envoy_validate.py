"""Real Envoy (`--mode validate`) accepts the routes HTTPRoutes and GRPCRoutes translate to:
path-element prefixes and gRPC method paths as RE2 regexes, prefix and full-path rewrites as
regex rewrites, redirects, mirrors, header modifiers and weighted backends."""

from __future__ import annotations

from pathlib import Path

import pytest
from envoy.config.bootstrap.v3.bootstrap_pb2 import Bootstrap
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.core.v3.address_pb2 import Address, SocketAddress
from envoy.config.endpoint.v3.endpoint_components_pb2 import (
    Endpoint,
    LbEndpoint,
    LocalityLbEndpoints,
)
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.config.listener.v3.listener_components_pb2 import Filter, FilterChain
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.route.v3.route_components_pb2 import VirtualHost
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from envoy.extensions.filters.http.fault.v3.fault_pb2 import HTTPFault
from envoy.extensions.filters.http.router.v3.router_pb2 import Router
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
    HttpFilter,
)

from control.generate.route_translation import RouteSpec, WeightedCluster, build_route
from tests.integration.test_generate_envoy_validate import validate
from tests.support.gatewayapi import (
    GRPC_RULES,
    HTTP_RULES,
    gateway,
    gateway_class,
    load,
    route,
    service,
)

pytestmark = pytest.mark.envoy


def _cluster(name: str, port: int) -> Cluster:
    cluster = Cluster(name=name, type=Cluster.STATIC)
    cluster.connect_timeout.FromSeconds(1)
    address = Address(socket_address=SocketAddress(address="127.0.0.1", port_value=port))
    cluster.load_assignment.CopyFrom(
        ClusterLoadAssignment(
            cluster_name=name,
            endpoints=[
                LocalityLbEndpoints(lb_endpoints=[LbEndpoint(endpoint=Endpoint(address=address))])
            ],
        )
    )
    return cluster


def test_envoy_accepts_translated_routes(tmp_path: Path) -> None:
    mesh = load(
        gateway_class(),
        service("v1"),
        service("v2"),
        gateway(),
        route("r", hostnames=["r.example.com"], rules=HTTP_RULES),
        route("g", kind="GRPCRoute", hostnames=["g.example.com"], rules=GRPC_RULES),
    )
    assert len(mesh.virtual_services) == 2
    clusters = {"v1.infra.svc.cluster.local": "v1", "v2.infra.svc.cluster.local": "v2"}
    config = RouteConfiguration(name="gateway")
    count = 0
    for vs in mesh.virtual_services:
        host = VirtualHost(name=vs.hosts[0], domains=list(vs.hosts))
        for r in vs.http:
            spec = RouteSpec(
                route=r,
                matches=r.matches,
                targets=tuple(
                    WeightedCluster(clusters[d.host], d.weight, d.headers) for d in r.destinations
                ),
                mirror_cluster=clusters[r.mirror.host] if r.mirror is not None else "",
            )
            host.routes.extend(build_route(spec))
            count += 1
        config.virtual_hosts.append(host)
    assert count == 9
    hcm = HttpConnectionManager(stat_prefix="gateway", route_config=config)
    fault = HttpFilter(name="envoy.filters.http.fault")
    fault.typed_config.Pack(HTTPFault())
    router = HttpFilter(name="envoy.filters.http.router")
    router.typed_config.Pack(Router())
    hcm.http_filters.extend([fault, router])
    network = Filter(name="envoy.filters.network.http_connection_manager")
    network.typed_config.Pack(hcm)
    listener = Listener(
        name="gateway",
        address=Address(socket_address=SocketAddress(address="127.0.0.1", port_value=18080)),
        filter_chains=[FilterChain(filters=[network])],
    )
    bootstrap = Bootstrap()
    bootstrap.node.id = "router~127.0.0.1~gw.infra~infra.svc.cluster.local"
    bootstrap.node.cluster = "pilotfish-validate"
    bootstrap.static_resources.clusters.extend([_cluster("v1", 9001), _cluster("v2", 9002)])
    bootstrap.static_resources.listeners.append(listener)
    result = validate(bootstrap, tmp_path / "envoy.json")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "deprecated" not in output.lower(), output
