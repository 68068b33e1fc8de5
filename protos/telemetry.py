"""The standard-metrics contract between the control plane's generated config and the agent.

Upstream Envoy has no Istio stats filter, so the agent computes Istio's standard metrics from
Envoy's gRPC access log (ALS) entries, streamed to it over `<workdir>/ALS`. Both sides must
agree on these names; neither imports the other, so they live here:

- The agent's bootstrap defines the static cluster `ALS_CLUSTER` on that socket and says so in
  node metadata `ALS_NODE_METADATA: "true"`; only then does the control plane generate loggers
  that name the cluster (Envoy rejects a listener whose logger names an unknown cluster).
- Every generated logger has log name `LOG_NAME` and literal custom tags (`TAG_*`): who this
  proxy is, as the control plane knows it, and which side it reports for.
- Peer metadata travels in the `PEER_HEADER` request header (client sidecar → server sidecar)
  and response header (server → client), value `encode_peer(...)`: an
  `application/x-www-form-urlencoded` list of the `PEER_FIELDS`. The receiving sidecar moves
  it into dynamic metadata `METADATA_NAMESPACE`/`METADATA_PEER` and strips it, so apps never
  see it and cannot set it. On the client side, `UPSTREAM_PEER_HEADER` (set by Envoy from the
  upstream's certificate, stripped at once) carries the upstream's SPIFFE ID into
  `METADATA_UPSTREAM_PRINCIPAL`: without it the response's peer metadata is not trusted.
- The Telemetry API's metric overrides for the side a logger reports (metrics not exported,
  labels removed per metric) travel as one more literal tag, `TAG_OVERRIDES`, value
  `encode_overrides(...)`; absent when nothing is overridden. A logger's config is what
  changes when a Telemetry does, so connected proxies get the change with their listeners.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Final
from urllib.parse import parse_qsl, urlencode

ALS_CLUSTER: Final = "pilotfish-als"
ALS_NODE_METADATA: Final = "PILOTFISH_ALS"
LOG_NAME: Final = "pilotfish-metrics"

PEER_HEADER: Final = "x-pilotfish-peer-metadata"
UPSTREAM_PEER_HEADER: Final = "x-pilotfish-upstream-peer"
METADATA_NAMESPACE: Final = "pilotfish.peer"
METADATA_PEER: Final = "peer"
METADATA_UPSTREAM_PRINCIPAL: Final = "upstream_principal"

REPORTER_SOURCE: Final = "source"
REPORTER_DESTINATION: Final = "destination"

TAG_REPORTER: Final = "reporter"
TAG_WORKLOAD: Final = "workload"
TAG_NAMESPACE: Final = "workload_namespace"
TAG_APP: Final = "app"
TAG_VERSION: Final = "version"
TAG_PRINCIPAL: Final = "principal"
TAG_CLUSTER_DOMAIN: Final = "cluster_domain"
TAG_OVERRIDES: Final = "metric_overrides"

# Istio's names of the standard metrics (Telemetry `match.metric`), HTTP then TCP.
HTTP_METRICS: Final = ("REQUEST_COUNT", "REQUEST_DURATION", "REQUEST_SIZE", "RESPONSE_SIZE")
TCP_METRICS: Final = (
    "TCP_SENT_BYTES",
    "TCP_RECEIVED_BYTES",
    "TCP_OPENED_CONNECTIONS",
    "TCP_CLOSED_CONNECTIONS",
)
STANDARD_METRICS: Final = HTTP_METRICS + TCP_METRICS
MAX_OVERRIDES_VALUE: Final = 4096

# What a peer says about itself (the workload's own tags, without reporter and principal:
# principals come from certificates only).
PEER_FIELDS: Final = (TAG_WORKLOAD, TAG_NAMESPACE, TAG_APP, TAG_VERSION)

# A longer header value is not decoded (a flood of bytes buys nothing).
MAX_PEER_VALUE: Final = 1024


# What a label value may hold (Kubernetes' rule); anything else is replaced by `_`, so the
# encoded value never holds `%`, which Envoy's header formatter would read as a command.
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def encode_peer(fields: Mapping[str, str]) -> str:
    return urlencode([(k, _UNSAFE.sub("_", fields[k])) for k in PEER_FIELDS if fields.get(k)])


def decode_peer(value: str) -> dict[str, str]:
    """The known fields of a `PEER_HEADER` value; {} for anything malformed or oversized."""
    if not value or len(value) > MAX_PEER_VALUE:
        return {}
    try:
        pairs = parse_qsl(value, strict_parsing=True, max_num_fields=len(PEER_FIELDS) * 2)
    except ValueError:
        return {}
    return {k: v for k, v in pairs if k in PEER_FIELDS and v}


def encode_overrides(disabled: frozenset[str], removed: Mapping[str, frozenset[str]]) -> str:
    """`TAG_OVERRIDES`' value: the metrics not exported and, per metric, the labels removed
    ("" when there is nothing to say, and the tag is left out)."""
    body: dict[str, object] = {}
    if disabled:
        body["disabled"] = sorted(disabled)
    kept = {m: sorted(tags) for m, tags in sorted(removed.items()) if tags and m not in disabled}
    if kept:
        body["removed"] = kept
    return json.dumps(body, separators=(",", ":"), sort_keys=True) if body else ""


def decode_overrides(value: str) -> tuple[frozenset[str], dict[str, frozenset[str]]] | None:
    """(disabled metrics, removed labels per metric) from a `TAG_OVERRIDES` value; names that
    are not standard metrics are dropped. None for anything malformed or oversized."""
    if len(value) > MAX_OVERRIDES_VALUE:
        return None
    try:
        body = json.loads(value)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    disabled = body.get("disabled", [])
    removed = body.get("removed", {})
    if not isinstance(disabled, list) or not isinstance(removed, dict):
        return None
    if not all(isinstance(m, str) for m in disabled):
        return None
    out: dict[str, frozenset[str]] = {}
    for metric, tags in removed.items():
        if not isinstance(tags, list) or not all(isinstance(x, str) for x in tags):
            return None
        if metric in STANDARD_METRICS:
            out[metric] = frozenset(tags)
    return frozenset(m for m in disabled if m in STANDARD_METRICS), out
