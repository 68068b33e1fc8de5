"""The access logger variants access_loggers.py compares: each one's `access_log` entries for
an HCM and the clusters it needs, and listeners as a checkout's control plane instruments a
sidecar's side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from control.generate.access_logs import ISTIO_TEXT_FORMAT
from protos import telemetry as t
from tests.benchmarks.gateway import _address

ROOT = Path(__file__).resolve().parents[2]
SIDES = {"client": "OUTBOUND", "server": "INBOUND"}
_LOGGERS = "type.googleapis.com/envoy.extensions.access_loggers"
_HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

# The workload tags a sidecar's logger carries (what the control plane writes).
TAGS = {
    "reporter": "destination",
    "workload": "backend-0",
    "workload_namespace": "default",
    "app": "backend",
    "version": "v1",
    "principal": "spiffe://cluster.local/ns/default/sa/backend",
    "cluster_domain": "cluster.local",
}
# The per-request fields the standard metrics read, as Envoy format commands.
FIELDS = dict(t.RECORD_LABEL_FIELDS + t.RECORD_VALUE_FIELDS)


def _pipe_cluster(name: str, path: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": str(path)}}}}]}
            ],
        },
        "typed_extension_protocol_options": {
            _HTTP_OPTIONS: {
                "@type": f"type.googleapis.com/{_HTTP_OPTIONS}",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
    }


def logger(variant: str, workdir: Path, fluentd: tuple[str, int]) -> tuple[list[Any], list[Any]]:
    """(access_log entries for an HCM, extra clusters) for one variant."""
    if variant == "none":
        return [], []
    if variant == "grpc":
        config: dict[str, Any] = {
            "@type": f"{_LOGGERS}.grpc.v3.HttpGrpcAccessLogConfig",
            "common_config": {
                "log_name": "pilotfish-metrics",
                "grpc_service": {"envoy_grpc": {"cluster_name": "pilotfish-als"}},
                "transport_api_version": "V3",
                "buffer_flush_interval": "1s",
                "buffer_size_bytes": 1024 * 1024,
                "custom_tags": [{"tag": k, "literal": {"value": v}} for k, v in TAGS.items()],
            },
            "additional_request_headers_to_log": ["content-type"],
            "additional_response_headers_to_log": ["grpc-status"],
            "additional_response_trailers_to_log": ["grpc-status"],
        }
        cluster = _pipe_cluster("pilotfish-als", str(workdir / "ALS"))
        return [{"name": "envoy.access_loggers.http_grpc", "typed_config": config}], [cluster]
    if variant == "fifo":
        config = {
            "@type": f"{_LOGGERS}.file.v3.FileAccessLog",
            "path": str(workdir / "METRICS"),
            "log_format": {"text_format_source": {"inline_string": t.record_format(TAGS)}},
        }
        return [{"name": "envoy.access_loggers.file", "typed_config": config}], []
    if variant == "text":
        config = {
            "@type": f"{_LOGGERS}.file.v3.FileAccessLog",
            "path": str(workdir / "access.log"),
            "log_format": {"text_format_source": {"inline_string": ISTIO_TEXT_FORMAT}},
        }
        return [{"name": "envoy.access_loggers.file", "typed_config": config}], []
    if variant == "fluentd":
        config = {
            "@type": f"{_LOGGERS}.fluentd.v3.FluentdAccessLogConfig",
            "cluster": "fluentd",
            "tag": "pilotfish",
            "stat_prefix": "fluentd",
            "buffer_flush_interval": "1s",
            "buffer_size_bytes": 1024 * 1024,
            "record": {**TAGS, **FIELDS},
        }
        cluster = {
            "name": "fluentd",
            "type": "STATIC",
            "connect_timeout": "1s",
            "load_assignment": {
                "cluster_name": "fluentd",
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(*fluentd)}}]}],
            },
        }
        return [{"name": "envoy.access_loggers.fluentd", "typed_config": config}], [cluster]
    raise ValueError(variant)


# Run in a checkout (its own code first on sys.path): a listener's JSON on stdin, the same
# listener with that checkout's metrics instrumentation on stdout.
_INSTRUMENT = """
import json, sys
from google.protobuf.json_format import MessageToDict, ParseDict
import envoy.extensions.filters.http.router.v3.router_pb2
import envoy.extensions.transport_sockets.tls.v3.tls_pb2
from envoy.config.listener.v3.listener_pb2 import Listener
from control.generate.telemetry_metrics import WorkloadTelemetry, instrument_listener
args = json.loads(sys.argv[1])
telemetry = WorkloadTelemetry(
    workload=args["workload"], namespace=args["workload_namespace"], app=args["app"],
    version=args["version"], principal=args["principal"],
    cluster_domain=args["cluster_domain"], log_path=args["log"],
)
listener = ParseDict(json.load(sys.stdin), Listener())
print(json.dumps(MessageToDict(instrument_listener(listener, telemetry))))
"""


def instrumented(
    bootstrap: dict[str, Any], side: str, log: Path, root: Path = ROOT
) -> dict[str, Any]:
    """`bootstrap` with its listeners as the control plane at `root` instruments a sidecar's
    `side` (client or server) HCMs."""
    args = json.dumps({**TAGS, "log": str(log)})
    listeners = []
    for listener in bootstrap["static_resources"]["listeners"]:
        listener = {**listener, "traffic_direction": SIDES[side]}
        out = subprocess.run(
            [sys.executable, "-c", _INSTRUMENT, args],
            input=json.dumps(listener),
            capture_output=True,
            text=True,
            cwd=root,
            check=True,
        ).stdout
        listeners.append(json.loads(out))
    bootstrap["static_resources"]["listeners"] = listeners
    return bootstrap
