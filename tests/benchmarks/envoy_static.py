"""A static Envoy bootstrap that is a running Envoy's own config: what its admin
`/config_dump?include_eds` says it holds (bootstrap, listeners, routes, clusters, endpoints,
secrets), with everything it got over xDS turned into `static_resources`.

What differs from the dumped Envoy, and why each is needed:

- no `dynamic_resources` (the point: nothing comes over xDS);
- RDS route names become the route configurations themselves, inline in their HCM;
- EDS clusters become STATIC clusters with the endpoints the dump shows;
- SDS secrets become static secrets, fetched in full from the agent's SDS socket (the dump
  redacts private keys), and their references lose their `sds_config`: a reference without
  one names a static secret;
- the pod address (listeners, admin, status clusters) is the new Envoy's own, so both can run
  at once on this machine;
- node fields Envoy fills in itself (extensions, build version) are left out.

Everything else (filters, access loggers and their ALS cluster, tracing, cluster options, the
node's id and metadata) is copied unchanged, so whatever the first Envoy does per request the
second does too.
"""

from __future__ import annotations

import copy
import json
import urllib.request
from pathlib import Path
from typing import Any

import grpc
from envoy.extensions.transport_sockets.tls.v3.secret_pb2 import Secret
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest, DiscoveryResponse
from google.protobuf.json_format import MessageToDict

SDS_FETCH = "/envoy.service.secret.v3.SecretDiscoveryService/FetchSecrets"
SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
_DUMP_TYPE = "type.googleapis.com/envoy.admin.v3."
# Node fields Envoy computes at start: a bootstrap that sets them is ignored or refused.
_NODE_COMPUTED = ("extensions", "user_agent_build_version", "user_agent_name")

Json = dict[str, Any]


def config_dump(admin: str) -> dict[str, Json]:
    """The sections of `/config_dump?include_eds` at `admin` (host:port), by their type's
    short name (`BootstrapConfigDump`, `ClustersConfigDump`, ...)."""
    with urllib.request.urlopen(f"http://{admin}/config_dump?include_eds", timeout=10) as r:
        dump = json.loads(r.read())
    return {c["@type"].removeprefix(_DUMP_TYPE): c for c in dump["configs"]}


def secret_names(dump: dict[str, Json]) -> list[str]:
    secrets = dump.get("SecretsConfigDump", {})
    return sorted(s["name"] for s in secrets.get("dynamic_active_secrets", []))


async def fetch_secrets(sds_socket: Path, names: list[str]) -> list[Json]:
    """The named secrets in full (keys included) from an agent's SDS socket, as bootstrap
    JSON: the same bytes the dumped Envoy was served."""
    if not names:
        return []
    async with grpc.aio.insecure_channel(f"unix:{sds_socket}") as channel:
        fetch = channel.unary_unary(
            SDS_FETCH,
            request_serializer=DiscoveryRequest.SerializeToString,
            response_deserializer=DiscoveryResponse.FromString,
        )
        response = await fetch(
            DiscoveryRequest(type_url=SECRET_TYPE, resource_names=names), timeout=15
        )
    out = []
    for resource in response.resources:
        secret = Secret()
        resource.Unpack(secret)
        out.append(MessageToDict(secret, preserving_proto_field_name=True))
    return out


def static_bootstrap(dump: dict[str, Json], secrets: list[Json], old_ip: str, new_ip: str) -> Json:
    """The dumped Envoy's config as a static bootstrap for an Envoy on `new_ip`."""
    bootstrap: Json = copy.deepcopy(dump["BootstrapConfigDump"]["bootstrap"])
    bootstrap.pop("dynamic_resources", None)
    for name in _NODE_COMPUTED:
        bootstrap.get("node", {}).pop(name, None)
    routes = {
        r["route_config"]["name"]: _message(r["route_config"])
        for r in dump.get("RoutesConfigDump", {}).get("dynamic_route_configs", [])
    }
    endpoints = {
        e["endpoint_config"]["cluster_name"]: _load_assignment(e["endpoint_config"])
        for e in dump.get("EndpointsConfigDump", {}).get("dynamic_endpoint_configs", [])
    }
    static = bootstrap.setdefault("static_resources", {})
    listeners = static.setdefault("listeners", [])
    for entry in dump["ListenersConfigDump"].get("dynamic_listeners", []):
        if "active_state" in entry:
            listeners.append(_inline_routes(_message(entry["active_state"]["listener"]), routes))
    clusters = static.setdefault("clusters", [])
    for entry in dump["ClustersConfigDump"].get("dynamic_active_clusters", []):
        clusters.append(_static_cluster(_message(entry["cluster"]), endpoints))
    if secrets:
        static["secrets"] = secrets
        _static_secret_refs(static, {s["name"] for s in secrets})
    _readdress(bootstrap, old_ip, new_ip)
    return bootstrap


def _message(value: Json) -> Json:
    out = copy.deepcopy(value)
    out.pop("@type", None)
    return out


def _inline_routes(listener: Json, routes: dict[str, Json]) -> Json:
    for hcm in _walk(listener):
        rds = hcm.get("rds")
        if isinstance(rds, dict) and "route_config_name" in rds:
            name = rds["route_config_name"]
            if name not in routes:
                raise SystemExit(f"config dump: listener {listener['name']} names route {name!r}")
            del hcm["rds"]
            hcm["route_config"] = routes[name]
    return listener


def _load_assignment(assignment: Json) -> Json:
    out = _message(assignment)
    for locality in out.get("endpoints", []):
        # The dump shows an unset locality weight as 0, which a config may not say.
        if not locality.get("load_balancing_weight"):
            locality.pop("load_balancing_weight", None)
    return out


def _static_cluster(cluster: Json, endpoints: dict[str, Json]) -> Json:
    if cluster.get("type") != "EDS":
        return cluster
    service = cluster.pop("eds_cluster_config", {}).get("service_name") or cluster["name"]
    cluster["type"] = "STATIC"
    cluster["load_assignment"] = {
        **endpoints.get(service, {"endpoints": []}),
        "cluster_name": cluster["name"],
    }
    return cluster


def _static_secret_refs(tree: Json, names: set[str]) -> None:
    for node in _walk(tree):
        if node.get("name") in names and "sds_config" in node:
            del node["sds_config"]


def _readdress(tree: Json, old_ip: str, new_ip: str) -> None:
    for node in _walk(tree):
        socket = node.get("socket_address")
        if isinstance(socket, dict) and socket.get("address") == old_ip:
            socket["address"] = new_ip


def _walk(tree: Any) -> list[Json]:
    """Every dict in a JSON tree (the tree itself first)."""
    out: list[Json] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            out.append(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out
