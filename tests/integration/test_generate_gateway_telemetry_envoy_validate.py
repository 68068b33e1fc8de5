"""Telemetry on a router's listeners: every HCM and TCP proxy of every server shape gets the
mesh's access log, every HCM the tracer, and (when its bootstrap has the ALS cluster) the
standard-metrics logger as a `source` reporter with the router's own workload and the
client-side peer-metadata filters; real Envoy accepts it in both interception modes."""

from __future__ import annotations

from pathlib import Path

import pytest
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.extensions.access_loggers.file.v3.file_pb2 import FileAccessLog
from envoy.extensions.access_loggers.grpc.v3.als_pb2 import (
    HttpGrpcAccessLogConfig,
    TcpGrpcAccessLogConfig,
)
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)
from envoy.extensions.filters.network.tcp_proxy.v3.tcp_proxy_pb2 import TcpProxy

from control.config.meshconfig import parse_mesh_config
from control.generate import ROUTER_GENERATORS
from control.generate.access_logs import FILE_LOGGER
from control.generate.context import GenContext
from control.generate.filters import HCM_FILTER, TCP_PROXY_FILTER
from control.generate.resource_names import CLUSTER_TYPE, LISTENER_TYPE
from control.generate.telemetry_metrics import (
    HEADER_MUTATION_FILTER,
    HEADER_TO_METADATA_FILTER,
    HTTP_GRPC_LOGGER,
    TCP_GRPC_LOGGER,
)
from control.generate.tracing import ZIPKIN_TRACER
from control.model.index import MeshIndex
from control.xds.cache import ResourceCache, ResourceSet
from protos import telemetry as t
from tests.integration.test_generate_envoy_validate import static_bootstrap, unpack, validate
from tests.integration.test_generate_security_envoy_validate import sds_cluster
from tests.support.gateways import GATEWAY_MESH, router
from tests.support.traffic import mesh_config
from tests.unit.test_telemetry import TRACED

pytestmark = pytest.mark.envoy


LOG_PATH = "/var/run/pilotfish/METRICS"


def _generate(mode: str, als: bool, log: str = LOG_PATH) -> dict[str, ResourceSet]:
    proxy = router(mode=mode, als=als, log=log)
    index = MeshIndex(mesh_config(GATEWAY_MESH), [], mesh=parse_mesh_config(TRACED, "mesh.yaml"))
    ctx = GenContext(index, ResourceCache())
    return {type_: gen(ctx, proxy) for type_, gen in ROUTER_GENERATORS.items()}


def _listeners(sets: dict[str, ResourceSet]) -> list[Listener]:
    out = []
    for resource in sets[LISTENER_TYPE].values():
        listener = unpack(resource.any_bytes, Listener)
        assert isinstance(listener, Listener)
        out.append(listener)
    return out


@pytest.mark.parametrize("mode", ["NONE", "REDIRECT"])
def test_router_listeners_carry_logs_tracing_and_metrics(mode: str) -> None:
    sets = _generate(mode, als=True)
    assert any(n.startswith("outbound|9411||") for n in sets[CLUSTER_TYPE])
    hcms = tcps = 0
    for listener in _listeners(sets):
        for chain in listener.filter_chains:
            for f in chain.filters:
                if f.name == HCM_FILTER:
                    hcms += 1
                    hcm = HttpConnectionManager()
                    f.typed_config.Unpack(hcm)
                    assert hcm.tracing.provider.name == ZIPKIN_TRACER
                    names = [a.name for a in hcm.access_log]
                    # The user's log (MeshConfig), then the metrics records.
                    assert names == [FILE_LOGGER, FILE_LOGGER]
                    record = FileAccessLog()
                    hcm.access_log[1].typed_config.Unpack(record)
                    assert record.path == LOG_PATH
                    fmt = record.log_format.text_format_source.inline_string
                    fields = fmt.split(t.RECORD_SEPARATOR)[1 : 1 + len(t.RECORD_TAGS)]
                    _check_tags(dict(zip(t.RECORD_TAGS, fields, strict=True)))
                    # Client side: no metadata sent (its peers name the router from the
                    # peer table, as it names the backend): no filter, no early mutation.
                    names = [h.name for h in hcm.http_filters]
                    assert HEADER_TO_METADATA_FILTER not in names
                    assert HEADER_MUTATION_FILTER not in names
                    assert not hcm.early_header_mutation_extensions
                elif f.name == TCP_PROXY_FILTER:
                    tcps += 1
                    tcp = TcpProxy()
                    f.typed_config.Unpack(tcp)
                    assert [a.name for a in tcp.access_log] == [FILE_LOGGER, TCP_GRPC_LOGGER]
                    tcp_config = TcpGrpcAccessLogConfig()
                    tcp.access_log[1].typed_config.Unpack(tcp_config)
                    custom = tcp_config.common_config.custom_tags
                    _check_tags({tag.tag: tag.literal.value for tag in custom})
    # GATEWAY_MESH: HTTP, HTTPS and MUTUAL (HCMs), PASSTHROUGH and TCP (TCP proxies).
    assert hcms >= 3 and tcps >= 2


def test_router_of_an_older_agent_logs_http_to_the_als_cluster() -> None:
    """An agent that announces no metrics FIFO gets the gRPC logger, with the same tags."""
    for listener in _listeners(_generate("NONE", als=True, log="")):
        for chain in listener.filter_chains:
            for f in chain.filters:
                if f.name == HCM_FILTER:
                    hcm = HttpConnectionManager()
                    f.typed_config.Unpack(hcm)
                    assert [a.name for a in hcm.access_log] == [FILE_LOGGER, HTTP_GRPC_LOGGER]
                    config = HttpGrpcAccessLogConfig()
                    hcm.access_log[1].typed_config.Unpack(config)
                    custom = config.common_config.custom_tags
                    _check_tags({tag.tag: tag.literal.value for tag in custom})


def _check_tags(tags: dict[str, str]) -> None:
    assert tags[t.TAG_REPORTER] == t.REPORTER_SOURCE
    assert tags[t.TAG_WORKLOAD] == "ingress"
    assert tags[t.TAG_NAMESPACE] == "edge"
    assert tags[t.TAG_PRINCIPAL] == "spiffe://cluster.local/ns/edge/sa/ingress"


def test_router_without_als_cluster_gets_no_metrics_loggers() -> None:
    sets = _generate("NONE", als=False)
    text = b"".join(r.any_bytes for r in sets[LISTENER_TYPE].values())
    assert t.ALS_CLUSTER.encode() not in text
    assert LOG_PATH.encode() not in text
    assert FILE_LOGGER.encode() in text


@pytest.mark.parametrize("mode", ["NONE", "REDIRECT"])
def test_envoy_accepts_router_telemetry(tmp_path: Path, mode: str) -> None:
    log = str(tmp_path / "METRICS")
    sets = _generate(mode, als=True, log=log)
    bootstrap = static_bootstrap(router(mode=mode, als=True, log=log), sets)
    bootstrap.static_resources.clusters.append(sds_cluster(tmp_path / "SDS"))
    als = sds_cluster(tmp_path / "ALS")
    als.name = als.load_assignment.cluster_name = t.ALS_CLUSTER
    bootstrap.static_resources.clusters.append(als)
    result = validate(bootstrap, tmp_path / "envoy.json")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "deprecated" not in output.lower(), output
