"""Envoy bootstrap generation (`<workdir>/envoy-rev.json`).

A pure function of `BootstrapOptions`: node identity and metadata as Istio lays them out, ADS
to the control plane (through the agent's `<workdir>/XDS` Unix socket, or straight to a TCP
address when Envoy talks to the control plane directly, as in tests and the first demo), the
`sds-grpc` cluster on the agent's `<workdir>/SDS` socket, the admin endpoint on the pod IP, and
Istio's two static listeners: readiness on `<ip>:15021` (forwarded to the agent's status
server) and Prometheus on `<ip>:15090` (forwarded to the admin's `/stats/prometheus`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from protos.nodeid import identity_metadata, node_id
from protos.telemetry import ALS_CLUSTER, ALS_NODE_METADATA, LOG_NODE_METADATA

if TYPE_CHECKING:
    from agent.config import AgentConfig

XDS_CLUSTER = "xds-grpc"
# How soon Envoy dials the agent's xDS socket again after a failed try (Envoy's default: 0.5 s
# at first, doubling up to 30 s). The agent starts Envoy before it binds that socket
# (agent/envoy/earlystart.py), so Envoy's first try may find nothing there; the socket is
# local and the agent's own, so trying again soon costs nothing.
ADS_RETRY = {"retry_back_off": {"base_interval": "0.02s", "max_interval": "1s"}}
SDS_CLUSTER = "sds-grpc"
# Istio's names for the clusters behind the readiness and Prometheus listeners.
AGENT_CLUSTER = "agent"
PROMETHEUS_CLUSTER = "prometheus_stats"
# Static listeners get explicit names (Envoy would make up UUIDs) that cannot collide with
# the control plane's `<ip>_<port>` listener names.
READINESS_LISTENER = "agent-readiness"
PROMETHEUS_LISTENER = "agent-prometheus"
READINESS_PATH = "/healthz/ready"
PROMETHEUS_PATH = "/stats/prometheus"

_HCM = "envoy.filters.network.http_connection_manager"
_HCM_TYPE = (
    "type.googleapis.com/"
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)
_ROUTER_TYPE = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
_HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


@dataclass(frozen=True, slots=True, eq=False)
class BootstrapOptions:
    """What Envoy's bootstrap is made from (`from_agent_config`)."""

    ip: str
    pod_name: str
    namespace: str = "default"
    proxy_type: str = "sidecar"  # or "router" (a gateway)
    service_account: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict)
    # Where ADS lives: "unix:///path/XDS" or "host:port".
    xds_address: str = "127.0.0.1:15010"
    delta: bool = False
    admin_port: int = 15000
    interception_mode: str = "NONE"
    cluster_domain: str = "cluster.local"
    extra_metadata: Mapping[str, str] = field(default_factory=dict)
    # Every pod IP, in order (dual-stack: both families); () = just `ip`.
    instance_ips: tuple[str, ...] = ()
    # The agent's SDS socket (a filesystem path, "unix://" optional); None: no `sds-grpc`.
    sds_address: str | None = None
    # The agent's access log service socket, for the standard metrics (protos/telemetry.py);
    # None: no `pilotfish-als` cluster, and the control plane generates no metrics loggers.
    als_address: str | None = None
    # The agent's FIFO for HTTP metrics records (agent/telemetry/fifo.py), an absolute path;
    # None: HTTP connection managers log to the ALS cluster too.
    metrics_log: str | None = None
    # The agent's status server port on `ip`; None: no readiness listener.
    status_port: int | None = None
    readiness_port: int = 15021
    # None: no Prometheus listener.
    prometheus_port: int | None = 15090

    @property
    def node_id(self) -> str:
        return node_id(self.proxy_type, self.ip, self.pod_name, self.namespace, self.cluster_domain)

    @property
    def admin_url(self) -> str:
        return f"http://{_host_port(self.ip, self.admin_port)}"


def from_agent_config(cfg: AgentConfig) -> BootstrapOptions:
    """The bootstrap an agent writes: ADS and SDS over the workdir's Unix sockets."""
    return BootstrapOptions(
        ip=cfg.ip,
        instance_ips=cfg.instance_ips,
        pod_name=cfg.pod_name,
        namespace=cfg.namespace,
        proxy_type=cfg.proxy_type,
        service_account=cfg.service_account,
        labels=dict(cfg.labels),
        xds_address=f"unix://{cfg.xds_socket.absolute()}",
        delta=cfg.envoy_delta,
        admin_port=cfg.envoy_admin_port,
        cluster_domain=cfg.cluster_domain,
        # Envoy's stream names the agent's group too: every stream of the pod is the same
        # workload (the control plane registers it while any of them is open).
        extra_metadata={
            **cfg.extra_metadata,
            **({"WORKLOAD_GROUP": cfg.workload_group} if cfg.workload_group else {}),
        },
        interception_mode=cfg.interception_mode,
        sds_address=str(cfg.sds_socket.absolute()),
        als_address=str(cfg.als_socket.absolute()) if cfg.standard_metrics else None,
        metrics_log=str(cfg.metrics_fifo.absolute()) if cfg.standard_metrics else None,
        status_port=cfg.status_port,
    )


def _host_port(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _socket(ip: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": ip, "port_value": port}}


def _address(target: str) -> dict[str, Any]:
    if target.startswith("unix://"):
        return {"pipe": {"path": target.removeprefix("unix://")}}
    host, _, port = target.rpartition(":")
    return _socket(host.strip("[]"), int(port))


def node_metadata(opts: BootstrapOptions) -> dict[str, object]:
    meta = identity_metadata(opts)
    if opts.sds_address is not None:
        # The sds-grpc cluster reaches the agent's SDS server: the control plane may send
        # mTLS config that takes its certificates from there (without it, such config would
        # wait forever for secrets nobody serves).
        meta["SDS"] = "true"
    if opts.als_address is not None:
        meta[ALS_NODE_METADATA] = "true"
        if opts.metrics_log is not None:
            meta[LOG_NODE_METADATA] = opts.metrics_log
    meta.update(opts.extra_metadata)
    return meta


def _static_cluster(
    name: str, address: dict[str, Any], *, http2: bool = False, connect_timeout: str = "1s"
) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": connect_timeout,
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}],
        },
    }
    if http2:
        # gRPC (ADS, SDS) needs HTTP/2; keepalive notices a dead agent or control plane.
        cluster["typed_extension_protocol_options"] = {
            _HTTP_OPTIONS: {
                "@type": f"type.googleapis.com/{_HTTP_OPTIONS}",
                "explicit_http_config": {
                    "http2_protocol_options": {
                        "connection_keepalive": {"interval": "30s", "timeout": "10s"}
                    }
                },
            }
        }
    return cluster


def _forwarding_listener(
    name: str, address: dict[str, Any], stat_prefix: str, prefix: str, cluster: str
) -> dict[str, Any]:
    """A plain-HTTP listener that sends `prefix` to `cluster` and answers anything else 404."""
    hcm = {
        "@type": _HCM_TYPE,
        "codec_type": "AUTO",
        "stat_prefix": stat_prefix,
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "backend",
                    "domains": ["*"],
                    "routes": [
                        {"match": {"prefix": prefix}, "route": {"cluster": cluster}},
                        {"match": {"prefix": "/"}, "direct_response": {"status": 404}},
                    ],
                }
            ]
        },
        "http_filters": [
            {"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER_TYPE}}
        ],
    }
    return {
        "name": name,
        "address": address,
        "filter_chains": [{"filters": [{"name": _HCM, "typed_config": hcm}]}],
    }


def build_bootstrap(opts: BootstrapOptions) -> dict[str, Any]:
    app = opts.labels.get("app") or opts.pod_name
    ads_source = {"ads": {}, "resource_api_version": "V3"}
    admin = _socket(opts.ip, opts.admin_port)
    clusters = [_static_cluster(XDS_CLUSTER, _address(opts.xds_address), http2=True)]
    listeners: list[dict[str, Any]] = []
    if opts.sds_address is not None:
        path = opts.sds_address.removeprefix("unix://")
        clusters.append(_static_cluster(SDS_CLUSTER, {"pipe": {"path": path}}, http2=True))
    if opts.als_address is not None:
        path = opts.als_address.removeprefix("unix://")
        clusters.append(_static_cluster(ALS_CLUSTER, {"pipe": {"path": path}}, http2=True))
    if opts.status_port is not None:
        # Istio's short timeout: the agent is on the same host; a slow connect means it is
        # not ready, and the kubelet's probe should hear that quickly.
        clusters.append(
            _static_cluster(
                AGENT_CLUSTER, _socket(opts.ip, opts.status_port), connect_timeout="0.25s"
            )
        )
        listeners.append(
            _forwarding_listener(
                READINESS_LISTENER,
                _socket(opts.ip, opts.readiness_port),
                "agent",
                READINESS_PATH,
                AGENT_CLUSTER,
            )
        )
    if opts.prometheus_port is not None:
        # Scrapers get Envoy's stats without being given the admin port (which can change
        # config), as in Istio.
        clusters.append(_static_cluster(PROMETHEUS_CLUSTER, admin, connect_timeout="0.25s"))
        listeners.append(
            _forwarding_listener(
                PROMETHEUS_LISTENER,
                _socket(opts.ip, opts.prometheus_port),
                "stats",
                PROMETHEUS_PATH,
                PROMETHEUS_CLUSTER,
            )
        )
    static: dict[str, Any] = {"clusters": clusters}
    if listeners:
        static["listeners"] = listeners
    return {
        "node": {
            "id": opts.node_id,
            "cluster": f"{app}.{opts.namespace}",
            "metadata": node_metadata(opts),
        },
        "admin": {"address": admin},
        "dynamic_resources": {
            "ads_config": {
                "api_type": "DELTA_GRPC" if opts.delta else "GRPC",
                "transport_api_version": "V3",
                "grpc_services": [
                    {"envoy_grpc": {"cluster_name": XDS_CLUSTER, "retry_policy": ADS_RETRY}}
                ],
                "set_node_on_first_message_only": True,
            },
            "cds_config": ads_source,
            "lds_config": ads_source,
        },
        "static_resources": static,
        # Istio's setting: no connection cap of our own (the kernel and the pod's limits
        # apply), stated explicitly so Envoy does not warn about a missing limit at startup.
        "overload_manager": {
            "resource_monitors": [
                {
                    "name": "envoy.resource_monitors.global_downstream_max_connections",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.resource_monitors."
                        "downstream_connections.v3.DownstreamConnectionsConfig",
                        "max_active_downstream_connections": 2147483647,
                    },
                }
            ]
        },
    }


def bootstrap_json(opts: BootstrapOptions) -> str:
    return json.dumps(build_bootstrap(opts), indent=2, sort_keys=True) + "\n"


def write_bootstrap(path: Path | str, opts: BootstrapOptions) -> Path:
    """Write the bootstrap atomically (temp file in the same directory, then rename), so an
    Envoy (re)starting concurrently never reads a half-written file. Mode 0644: the file has
    no secrets, and Envoy may run as another user in a sidecar image.

    Synchronous: a few kilobytes to a local disk, written once at startup.
    """
    path = Path(path)
    # Not tempfile.mkstemp: tempfile imports shutil, bz2 and lzma, ~2 ms on the way to
    # Envoy's start and their memory for the agent's life. 96 random bits need no retry.
    tmp = path.parent / f".{path.name}.{os.urandom(12).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(bootstrap_json(opts))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
