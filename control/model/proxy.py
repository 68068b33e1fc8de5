"""A connected proxy, as its node identity and metadata describe it (Istio conventions)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from control.model.locality import locality_from_labels
from control.model.types import Labels, SourceRef, Workload, labels_of
from protos.telemetry import ALS_NODE_METADATA, LOG_NODE_METADATA, valid_log_path

# The certificate provider instance proxyless config names, as Istio's agent names it in the
# gRPC bootstrap; its certificate names are `default` (chain and key) and `ROOTCA`.
CERTIFICATE_PROVIDER: Final = "default"


class NodeError(ValueError):
    """The node sent by a client cannot identify a proxy."""


@dataclass(frozen=True, slots=True)
class Proxy:
    id: str
    type: str  # "sidecar", "router", ...
    ip: str
    ips: tuple[str, ...]
    pod_name: str
    namespace: str
    labels: Labels
    service_account: str
    interception_mode: str = "NONE"  # NONE or REDIRECT
    generator: str = ""  # "" (Envoy sidecar) or "grpc" (proxyless)
    cluster_id: str = ""
    dns_domain: str = ""
    # False (node metadata AUTO_REGISTER=false) opts out of auto-registration.
    auto_register: bool = True
    # The WorkloadGroup this proxy asks to join (node metadata WORKLOAD_GROUP, or Istio's
    # AUTO_REGISTER_GROUP); "" = none. Only a request: control/registry/autoregister.py
    # admits it when the stream's identity is the group's.
    workload_group: str = ""
    # The proxy can fetch certificates over SDS (node metadata `SDS`, as Istio's agents once
    # announced it): only then is it sent config that needs the `default`/`ROOTCA` secrets
    # (auto mTLS out, PeerAuthentication in). Envoy waits for a referenced secret forever, so
    # sending such config to a proxy without SDS would hold its clusters and listeners back.
    sds: bool = False
    # A proxyless client whose bootstrap has the `default` certificate provider (node metadata
    # CERTIFICATE_PROVIDER, written by the agent in proxy-only mode): only then may its config
    # name that provider (gRPC rejects a whole CDS or LDS response naming one it lacks).
    cert_provider: bool = False
    # Node metadata ISTIO_VERSION, as the proxy claims it: only a metric label (pilot_xds).
    istio_version: str = ""
    # The proxy's bootstrap has the cluster to its agent's access log service (node metadata
    # PILOTFISH_ALS): only then may its listeners log there (protos/telemetry.py).
    als: bool = False
    # Where its agent reads HTTP metrics records (node metadata PILOTFISH_METRICS_LOG, an
    # absolute path, checked: it becomes a logger's path); "": none, and HTTP connection
    # managers log to the ALS cluster instead, as agents before it expect.
    metrics_log: str = ""
    # The agent's status server port (node metadata STATUS_PORT); 0: not announced, Istio's
    # 15020. The dashboard reads the agent's metrics there.
    status_port: int = 0
    # `region/zone/subzone` (or a prefix of it): the node's locality, else what its labels
    # say (control/model/locality.py); "" unknown. Locality load balancing ranks endpoints
    # by it.
    locality: str = ""

    @property
    def is_grpc(self) -> bool:
        return self.generator == "grpc"

    @property
    def is_router(self) -> bool:
        """A gateway (`pilotfish-agent --proxy-type router`): it serves Gateway servers only."""
        return self.type == "router"

    def as_workload(self) -> Workload:
        """The workload this proxy's node describes, as claimed (generator tests use it; the
        registry builds registered workloads from their WorkloadGroup instead)."""
        return Workload(
            name=self.pod_name,
            namespace=self.namespace,
            address=self.ip,
            labels=self.labels,
            service_account=self.service_account,
            source=SourceRef("Proxy", self.namespace, self.pod_name),
            # Peers reach it with mTLS only if its Envoy can terminate mTLS (holds the certs),
            # or its gRPC server can (the certificate provider).
            has_sidecar=self.sds and not self.is_grpc,
            proxyless=self.is_grpc and self.cert_provider,
            locality=self.locality,
        )


def _str(meta: Mapping[str, Any], key: str) -> str:
    value = meta.get(key, "")
    return value if isinstance(value, str) else ""


def proxy_from_node(node_id: str, metadata: Mapping[str, Any], locality: str = "") -> Proxy:
    """Build a Proxy from an Envoy node id and its metadata (as a plain dict).

    The id has Istio's form `type~ip~pod.namespace~namespace.svc.cluster.local`; metadata keys
    (INSTANCE_IPS, NAMESPACE, LABELS, SERVICE_ACCOUNT, INTERCEPTION_MODE, GENERATOR, NAME, ...)
    win over what the id says. `locality`: the node's own (`region/zone/subzone`), which wins
    over the labels'.
    """
    if not node_id:
        raise NodeError("node id is empty")
    parts = node_id.split("~")
    if len(parts) != 4:
        raise NodeError(f"node id {node_id!r} is not of the form type~ip~pod.namespace~domain")
    ptype, id_ip, pod_ns, domain = parts
    pod_name, _, id_namespace = pod_ns.partition(".")
    ips_meta = _str(metadata, "INSTANCE_IPS")
    ips = tuple(i.strip() for i in ips_meta.split(",") if i.strip()) or ((id_ip,) if id_ip else ())
    if not ips:
        raise NodeError(f"node id {node_id!r} has no IP and INSTANCE_IPS is not set")
    namespace = _str(metadata, "NAMESPACE") or id_namespace or "default"
    raw_labels = metadata.get("LABELS") or {}
    labels = (
        labels_of({str(k): str(v) for k, v in raw_labels.items()})
        if isinstance(raw_labels, Mapping)
        else ()
    )
    mode = (_str(metadata, "INTERCEPTION_MODE") or "NONE").upper()
    generator = _str(metadata, "GENERATOR")
    if not generator and ptype == "proxyless":
        generator = "grpc"
    intern = sys.intern  # fields most proxies share are kept once, not once per stream
    return Proxy(
        id=node_id,
        type=intern(ptype),
        ip=ips[0],
        ips=ips,
        pod_name=_str(metadata, "NAME") or pod_name or ips[0],
        namespace=intern(namespace),
        labels=labels,
        service_account=intern(_str(metadata, "SERVICE_ACCOUNT") or "default"),
        interception_mode=intern(mode),
        generator=intern(generator),
        cluster_id=intern(_str(metadata, "CLUSTER_ID")),
        dns_domain=intern(domain),
        auto_register=_str(metadata, "AUTO_REGISTER").lower() != "false",
        workload_group=_str(metadata, "WORKLOAD_GROUP") or _str(metadata, "AUTO_REGISTER_GROUP"),
        sds=_str(metadata, "SDS").lower() in ("true", "1"),
        cert_provider=_str(metadata, "CERTIFICATE_PROVIDER") == CERTIFICATE_PROVIDER,
        istio_version=intern(_str(metadata, "ISTIO_VERSION")[:64]),
        als=_str(metadata, ALS_NODE_METADATA).lower() == "true",
        metrics_log=_log_path(_str(metadata, LOG_NODE_METADATA)),
        status_port=_port(metadata.get("STATUS_PORT")),
        locality=intern(locality or locality_from_labels(dict(labels))),
    )


def _log_path(value: str) -> str:
    return value if valid_log_path(value) else ""


def _port(value: object) -> int:
    """A port from metadata (a string, as Istio's ISTIO_META_* values are, or a number); 0
    for anything that is not one."""
    try:
        port = int(str(value)) if value is not None else 0
    except ValueError:
        return 0
    return port if 0 < port < 65536 else 0
