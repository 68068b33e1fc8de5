"""The standard-metrics contract between the control plane's generated config and the agent.

Upstream Envoy has no Istio stats filter, so the agent computes Istio's standard metrics from
Envoy's gRPC access log (ALS) entries, streamed to it over `<workdir>/ALS`. Both sides must
agree on these names; neither imports the other, so they live here:

- The agent's bootstrap defines the static cluster `ALS_CLUSTER` on that socket and says so in
  node metadata `ALS_NODE_METADATA: "true"`; only then does the control plane generate loggers
  that name the cluster (Envoy rejects a listener whose logger names an unknown cluster).
- Every generated logger has log name `LOG_NAME` and literal custom tags (`TAG_*`): who this
  proxy is, as the control plane knows it, and which side it reports for.
- No peer metadata travels in requests or responses: each side's agent names the other
  workload from the control plane's peer table (protos/peers.proto), by the peer's address
  and the SPIFFE ID in its certificate (the caller's on the server side, the upstream's on the
  client side). Istio exchanges metadata in headers, which costs a filter on each side of
  every request and lets a caller say who it is; the table costs neither. On the client side
  of the ALS path, `UPSTREAM_PEER_HEADER` (set by Envoy from the upstream's certificate,
  stripped at once) carries that SPIFFE ID into `METADATA_UPSTREAM_PRINCIPAL` (an ALS entry
  has no upstream TLS properties); a record has Envoy's `%UPSTREAM_PEER_URI_SAN%` instead.
- The Telemetry API's metric overrides for the side a logger reports (metrics not exported,
  labels removed per metric) travel as one more literal tag, `TAG_OVERRIDES`, value
  `encode_overrides(...)`; absent when nothing is overridden. A logger's config is what
  changes when a Telemetry does, so connected proxies get the change with their listeners.

HTTP requests are counted from a record per request instead of an ALS entry (Envoy's gRPC
logger cost ~18 us of Envoy CPU per request over HTTP, ~35 us over HTTPS; its file logger with
a short text format a small fraction of that: tests/benchmarks/access_loggers.py):

- The agent creates a FIFO (0600, owned by Envoy's user) and holds it open before Envoy starts
  (Envoy opens a logger's path for writing; a FIFO without a reader would block it), and says
  where in node metadata `LOG_NODE_METADATA: <absolute path>`. Only then does the control plane
  give HTTP connection managers Envoy's file logger (`envoy.access_loggers.file`) on that path
  with the format `record_format(tags)`; a proxy that announces no path (an older agent) gets
  the `http_grpc` logger to `ALS_CLUSTER` as before, with the same tags.
- A record is one line: fields separated by `RECORD_SEPARATOR` (0x1f, a byte Envoy's codecs
  refuse in header values, so no request can add a field; a line whose field count is wrong
  is dropped and counted anyway), ending in a newline (which no value can hold either):
  `RECORD_VERSION`, the literal tags in `RECORD_TAGS` order (escaped by `record_literal`: `%`
  doubled, control bytes replaced by `_`; "" when absent), then the `RECORD_LABEL_FIELDS`,
  then the `RECORD_VALUE_FIELDS` (Envoy format commands; Envoy writes `-` for a missing value;
  a label field the reporter's labels never read, `RECORD_UNREAD_FIELDS`, is a literal `-`).
  Labels come from the tags and label fields only, so the agent caches them keyed by the line
  up to the value fields. Fields a caller controls are truncated by Envoy (the `:N` suffix),
  so a record stays under `MAX_RECORD` bytes; a longer line is dropped and counted.
- Envoy writes records from its file flush thread, every second (the agent starts Envoy
  with `--file-flush-interval-msec 1000`) or when 64 KiB are buffered.
- TCP proxies keep the `tcp_grpc` logger to `ALS_CLUSTER` (one entry per connection and per
  5 s, not per request), and so do the agent's other ALS users.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Final

ALS_CLUSTER: Final = "pilotfish-als"
ALS_NODE_METADATA: Final = "PILOTFISH_ALS"
LOG_NAME: Final = "pilotfish-metrics"

UPSTREAM_PEER_HEADER: Final = "x-pilotfish-upstream-peer"
METADATA_NAMESPACE: Final = "pilotfish.peer"
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

# The HTTP metrics record (see the module doc).
LOG_NODE_METADATA: Final = "PILOTFISH_METRICS_LOG"
MAX_LOG_PATH: Final = 1024
RECORD_VERSION: Final = "pf3"
RECORD_SEPARATOR: Final = "\x1f"
RECORD_TAGS: Final = (
    TAG_REPORTER,
    TAG_WORKLOAD,
    TAG_NAMESPACE,
    TAG_APP,
    TAG_VERSION,
    TAG_PRINCIPAL,
    TAG_CLUSTER_DOMAIN,
    TAG_OVERRIDES,
)
# (name, Envoy format command). `upstream_principal` is the upstream certificate's URI SANs,
# read by Envoy at log time: what the ALS path has Envoy copy into a response header and from
# there into metadata, without that round trip. Envoy cannot truncate it (the command takes no
# length), but a caller does not choose it: the upstream's certificate does, and a record that
# a huge one made over-long is dropped and counted. `peer_host` is the caller's address as the
# socket has it (not one `x-forwarded-for` could make up).
RECORD_LABEL_FIELDS: Final = (
    ("peer_host", "%DOWNSTREAM_DIRECT_REMOTE_ADDRESS_WITHOUT_PORT%"),
    ("upstream_principal", "%UPSTREAM_PEER_URI_SAN%"),
    ("upstream_host", "%UPSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%"),
    ("peer_uri_san", "%DOWNSTREAM_PEER_URI_SAN%"),
    ("local_uri_san", "%DOWNSTREAM_LOCAL_URI_SAN%"),
    ("upstream_cluster", "%UPSTREAM_CLUSTER%"),
    ("response_flags", "%RESPONSE_FLAGS%"),
    ("authority", "%REQ(:AUTHORITY):1024%"),
    ("content_type", "%REQ(CONTENT-TYPE):64%"),
    ("response_code", "%RESPONSE_CODE%"),
    ("grpc_status_header", "%RESP(GRPC-STATUS):16%"),
    ("grpc_status_trailer", "%TRAILER(GRPC-STATUS):16%"),
)
# The label fields a reporter's labels never read (agent/telemetry/labels.py): a record has
# the literal `-` there instead, so Envoy does not look them up per request. The client side
# judges neither the caller nor its own certificate, and names its upstream by the upstream's
# address and certificate; the server side names the service from the authority, and its
# caller by the caller's address and certificate.
RECORD_UNREAD_FIELDS: Final = {
    REPORTER_SOURCE: frozenset({"peer_host", "peer_uri_san", "local_uri_san"}),
    REPORTER_DESTINATION: frozenset({"upstream_principal", "upstream_host", "upstream_cluster"}),
}
# Durations: microseconds from the first byte received to the last sent when Envoy has both
# (what the ALS entry's duration measures, to the microsecond), else Envoy's milliseconds.
RECORD_VALUE_FIELDS: Final = (
    ("duration_us", "%COMMON_DURATION(DS_RX_BEG:DS_TX_END:us)%"),
    ("duration_ms", "%DURATION%"),
    ("request_headers_bytes", "%REQUEST_HEADERS_BYTES%"),
    ("request_body_bytes", "%BYTES_RECEIVED%"),
    ("response_headers_bytes", "%RESPONSE_HEADERS_BYTES%"),
    ("response_body_bytes", "%BYTES_SENT%"),
)
MAX_RECORD: Final = 16384

_RECORD_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")


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


def record_literal(value: str) -> str:
    """`value` as literal text in an Envoy format string that cannot end a field or a line."""
    return _RECORD_UNSAFE.sub("_", value).replace("%", "%%")


def record_format(tags: Mapping[str, str]) -> str:
    """The file logger's format: one record per request (see the module doc), for the side
    `tags` names as the reporter."""
    unread = RECORD_UNREAD_FIELDS.get(tags.get(TAG_REPORTER, ""), frozenset())
    fields = [
        RECORD_VERSION,
        *(record_literal(tags.get(k, "")) for k in RECORD_TAGS),
        *("-" if name in unread else command for name, command in RECORD_LABEL_FIELDS),
        *(command for _, command in RECORD_VALUE_FIELDS),
    ]
    return RECORD_SEPARATOR.join(fields) + "\n"


def valid_log_path(path: str) -> bool:
    """Whether a `LOG_NODE_METADATA` value may become a logger's path: absolute, bounded, and
    nothing Envoy would read as a command (`%`) or a line end."""
    return (
        path.startswith("/")
        and len(path) <= MAX_LOG_PATH
        and "%" not in path
        and not _RECORD_UNSAFE.search(path)
    )
