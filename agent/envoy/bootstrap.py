"""Envoy bootstrap generation (`<workdir>/envoy-rev.json`).

A pure function of `BootstrapOptions`: node identity and metadata as Istio lays them out, ADS
to the control plane (through the agent's `<workdir>/XDS` Unix socket, or straight to a TCP
address when Envoy talks to the control plane directly, as in tests and the first demo), and
the admin endpoint on the pod IP.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

XDS_CLUSTER = "xds-grpc"


@dataclass(frozen=True, slots=True)
class BootstrapOptions:
    ip: str
    pod_name: str
    namespace: str = "default"
    service_account: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict)
    # Where ADS lives: "unix:///path/XDS" or "host:port".
    xds_address: str = "127.0.0.1:15010"
    delta: bool = False
    admin_port: int = 15000
    interception_mode: str = "NONE"
    cluster_domain: str = "cluster.local"
    extra_metadata: Mapping[str, str] = field(default_factory=dict)

    @property
    def node_id(self) -> str:
        return (
            f"sidecar~{self.ip}~{self.pod_name}.{self.namespace}~"
            f"{self.namespace}.svc.{self.cluster_domain}"
        )


def _address(target: str) -> dict[str, Any]:
    if target.startswith("unix://"):
        return {"pipe": {"path": target.removeprefix("unix://")}}
    host, _, port = target.rpartition(":")
    return {"socket_address": {"address": host.strip("[]"), "port_value": int(port)}}


def node_metadata(opts: BootstrapOptions) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "NAME": opts.pod_name,
        "NAMESPACE": opts.namespace,
        "INSTANCE_IPS": opts.ip,
        "SERVICE_ACCOUNT": opts.service_account,
        "LABELS": dict(opts.labels),
        "INTERCEPTION_MODE": opts.interception_mode,
        "CLUSTER_ID": "Kubernetes",
    }
    meta.update(opts.extra_metadata)
    return meta


def build_bootstrap(opts: BootstrapOptions) -> dict[str, Any]:
    app = opts.labels.get("app") or opts.pod_name
    ads_source = {"ads": {}, "resource_api_version": "V3"}
    return {
        "node": {
            "id": opts.node_id,
            "cluster": f"{app}.{opts.namespace}",
            "metadata": node_metadata(opts),
        },
        "admin": {"address": _address(f"{opts.ip}:{opts.admin_port}")},
        "dynamic_resources": {
            "ads_config": {
                "api_type": "DELTA_GRPC" if opts.delta else "GRPC",
                "transport_api_version": "V3",
                "grpc_services": [{"envoy_grpc": {"cluster_name": XDS_CLUSTER}}],
                "set_node_on_first_message_only": True,
            },
            "cds_config": ads_source,
            "lds_config": ads_source,
        },
        "static_resources": {
            "clusters": [
                {
                    "name": XDS_CLUSTER,
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                            "@type": "type.googleapis.com/"
                            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                            "explicit_http_config": {
                                "http2_protocol_options": {
                                    "connection_keepalive": {"interval": "30s", "timeout": "10s"}
                                }
                            },
                        }
                    },
                    "load_assignment": {
                        "cluster_name": XDS_CLUSTER,
                        "endpoints": [
                            {
                                "lb_endpoints": [
                                    {"endpoint": {"address": _address(opts.xds_address)}}
                                ]
                            }
                        ],
                    },
                }
            ]
        },
    }


def bootstrap_json(opts: BootstrapOptions) -> str:
    return json.dumps(build_bootstrap(opts), indent=2, sort_keys=True) + "\n"
