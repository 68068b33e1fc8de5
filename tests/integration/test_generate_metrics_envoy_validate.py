"""The standard-metrics config on generated listeners: every HCM of a proxy whose bootstrap
has the access log cluster writes records to its agent's metrics FIFO (or, when the agent
announced none, logs to the cluster) and every TCP proxy logs to the cluster, with the
proxy's own workload as tags (from its WorkloadGroup when registered) and the peer-metadata
filters on the right side; none of it for a proxy without the cluster; and real Envoy
accepts it in modes NONE and REDIRECT."""

from __future__ import annotations

from pathlib import Path

import pytest
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.extensions.access_loggers.file.v3.file_pb2 import FileAccessLog
from envoy.extensions.access_loggers.grpc.v3.als_pb2 import (
    HttpGrpcAccessLogConfig,
    TcpGrpcAccessLogConfig,
)
from envoy.extensions.filters.http.header_mutation.v3.header_mutation_pb2 import HeaderMutation
from envoy.extensions.filters.http.header_to_metadata.v3.header_to_metadata_pb2 import (
    Config as HeaderToMetadata,
)
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)
from envoy.extensions.filters.network.tcp_proxy.v3.tcp_proxy_pb2 import TcpProxy

from control.generate import GENERATORS
from control.generate.access_logs import FILE_LOGGER
from control.generate.context import GenContext
from control.generate.filters import HCM_FILTER, TCP_PROXY_FILTER
from control.generate.resource_names import LISTENER_TYPE
from control.generate.telemetry_metrics import (
    HEADER_MUTATION_FILTER,
    HEADER_TO_METADATA_FILTER,
    HTTP_GRPC_LOGGER,
    TCP_GRPC_LOGGER,
)
from control.model.index import MeshIndex
from control.model.proxy import Proxy, proxy_from_node
from control.model.types import MtlsMode, SourceRef, Workload, labels_of
from control.xds.cache import ResourceCache
from protos import telemetry as t
from tests.integration.test_generate_envoy_validate import static_bootstrap, unpack, validate
from tests.integration.test_generate_security_envoy_validate import sds_cluster, secured_mesh

pytestmark = pytest.mark.envoy


LOG_PATH = "/var/run/pilotfish/METRICS"


def _proxy(
    app: str, mode: str, *, als: bool = True, log: str = LOG_PATH, version: str = "v3"
) -> Proxy:
    meta: dict[str, object] = {
        "LABELS": {"app": app, "version": version},
        "INTERCEPTION_MODE": mode,
        "SERVICE_ACCOUNT": app,
        "SDS": "true",
    }
    if als:
        meta[t.ALS_NODE_METADATA] = "true"
    if log:
        meta[t.LOG_NODE_METADATA] = log
    return proxy_from_node(f"sidecar~127.0.1.1~{app}-7.default~default.svc.cluster.local", meta)


def _listeners(proxy: Proxy, workloads: list[Workload], mode: MtlsMode) -> list[Listener]:
    index = MeshIndex(secured_mesh(mode, with_rbac=True), workloads)
    sets = GENERATORS[LISTENER_TYPE](GenContext(index, ResourceCache()), proxy)
    out = []
    for name in sorted(sets):
        listener = unpack(sets[name].any_bytes, Listener)
        assert isinstance(listener, Listener)
        out.append(listener)
    return out


def _chains(listener: Listener) -> list:  # type: ignore[type-arg]
    chains = list(listener.filter_chains)
    if listener.HasField("default_filter_chain"):
        chains.append(listener.default_filter_chain)
    return chains


@pytest.mark.parametrize("log_path", [LOG_PATH, ""], ids=["records", "older-agent"])
@pytest.mark.parametrize("mode", ["NONE", "REDIRECT"])
def test_every_hcm_and_tcp_proxy_reports(mode: str, log_path: str) -> None:
    proxy = _proxy("reviews", mode, log=log_path)
    # Registered through a WorkloadGroup: the group names the workload and gives its labels.
    registered = Workload(
        name="reviews-7",
        namespace="default",
        address=proxy.ip,
        labels=labels_of({"app": "reviews", "version": "v1"}),
        service_account="reviews",
        source=SourceRef("WorkloadGroup", "default", "reviews-group"),
        has_sidecar=True,
    )
    hcms = tcps = 0
    for listener in _listeners(proxy, [registered], MtlsMode.PERMISSIVE):
        inbound = listener.traffic_direction == 1  # INBOUND
        for chain in _chains(listener):
            for f in chain.filters:
                if f.name == HCM_FILTER:
                    hcms += 1
                    hcm = HttpConnectionManager()
                    f.typed_config.Unpack(hcm)
                    _check_hcm(hcm, inbound=inbound, log=log_path)
                elif f.name == TCP_PROXY_FILTER:
                    tcps += 1
                    tcp = TcpProxy()
                    f.typed_config.Unpack(tcp)
                    [log] = tcp.access_log
                    assert log.name == TCP_GRPC_LOGGER
                    cfg = TcpGrpcAccessLogConfig()
                    log.typed_config.Unpack(cfg)
                    assert cfg.common_config.grpc_service.envoy_grpc.cluster_name == t.ALS_CLUSTER
                    assert tcp.access_log_options.flush_access_log_on_connected
                    assert tcp.access_log_options.access_log_flush_interval.seconds > 0
    assert hcms and tcps


def _metrics_tags(hcm: HttpConnectionManager, log: str) -> dict[str, str]:
    """The literal tags of the HCM's one metrics logger: the record format's when the agent
    announced a FIFO (`log`), else the gRPC logger's."""
    if log:
        assert HTTP_GRPC_LOGGER not in [a.name for a in hcm.access_log]
        [logger] = [a for a in hcm.access_log if a.name == FILE_LOGGER]
        record = FileAccessLog()
        logger.typed_config.Unpack(record)
        assert record.path == log
        fmt = record.log_format.text_format_source.inline_string
        fields = fmt.split(t.RECORD_SEPARATOR)
        assert fields[0] == t.RECORD_VERSION
        tags = {k: v for k, v in zip(t.RECORD_TAGS, fields[1:], strict=False) if v}
        assert fmt == t.record_format(tags)
        return tags
    [logger] = [a for a in hcm.access_log if a.name == HTTP_GRPC_LOGGER]
    cfg = HttpGrpcAccessLogConfig()
    logger.typed_config.Unpack(cfg)
    return {tag.tag: tag.literal.value for tag in cfg.common_config.custom_tags}


def _check_hcm(hcm: HttpConnectionManager, *, inbound: bool, log: str) -> None:
    tags = _metrics_tags(hcm, log)
    assert tags == {
        t.TAG_REPORTER: t.REPORTER_DESTINATION if inbound else t.REPORTER_SOURCE,
        t.TAG_WORKLOAD: "reviews-group",
        t.TAG_NAMESPACE: "default",
        t.TAG_APP: "reviews",
        t.TAG_VERSION: "v1",  # the group's label, not the proxy's claim (v3)
        t.TAG_PRINCIPAL: "spiffe://cluster.local/ns/default/sa/reviews",
        t.TAG_CLUSTER_DOMAIN: "cluster.local",
    }
    names = [f.name for f in hcm.http_filters]
    assert names[-1] == "envoy.filters.http.router"
    # No peer metadata is sent or read (the agents name peers from the peer table): no early
    # header mutation, and on the server side, mTLS or not, no filter at all.
    assert not hcm.early_header_mutation_extensions
    if inbound or log:
        # (A record reads the upstream's certificate itself: no header round trip.)
        assert HEADER_TO_METADATA_FILTER not in names
        assert HEADER_MUTATION_FILTER not in names
        assert t.UPSTREAM_PEER_HEADER.encode() not in hcm.SerializeToString()
        return
    # Client side on the ALS path: an ALS entry has no upstream certificate, so Envoy copies
    # its SPIFFE ID into a header (removing any the server sent first) for the metadata
    # filter to read.
    assert names[:2] == [HEADER_TO_METADATA_FILTER, HEADER_MUTATION_FILTER]
    read = HeaderToMetadata()
    hcm.http_filters[0].typed_config.Unpack(read)
    assert [(r.header, r.remove) for r in read.response_rules] == [(t.UPSTREAM_PEER_HEADER, True)]
    assert not read.request_rules
    mutation = HeaderMutation()
    hcm.http_filters[1].typed_config.Unpack(mutation)
    responses = mutation.mutations.response_mutations
    assert not mutation.mutations.request_mutations
    assert responses[0].remove == t.UPSTREAM_PEER_HEADER
    assert responses[1].append.header.value == "%UPSTREAM_PEER_URI_SAN%"


@pytest.mark.parametrize("mode", ["NONE", "REDIRECT"])
def test_no_metrics_config_without_the_access_log_cluster(mode: str) -> None:
    proxy = _proxy("reviews", mode, als=False)
    for listener in _listeners(proxy, [proxy.as_workload()], MtlsMode.PERMISSIVE):
        text = listener.SerializeToString()
        assert t.ALS_CLUSTER.encode() not in text
        assert LOG_PATH.encode() not in text


@pytest.mark.parametrize(
    ("app", "mode", "mtls"),
    [
        ("client", "NONE", MtlsMode.STRICT),
        ("reviews", "NONE", MtlsMode.PERMISSIVE),
        ("client", "REDIRECT", MtlsMode.PERMISSIVE),
        ("reviews", "REDIRECT", MtlsMode.DISABLE),
    ],
)
def test_envoy_accepts_metrics_config(tmp_path: Path, app: str, mode: str, mtls: MtlsMode) -> None:
    # A tag holding Envoy's command character (`%`) and a field separator stays literal text.
    proxy = _proxy(app, mode, log=str(tmp_path / "METRICS"), version="v3%DURATION%\x1f")
    index = MeshIndex(secured_mesh(mtls, with_rbac=True), [proxy.as_workload()])
    sets = {t_: gen(GenContext(index, ResourceCache()), proxy) for t_, gen in GENERATORS.items()}
    bootstrap = static_bootstrap(proxy, sets)
    bootstrap.static_resources.clusters.append(sds_cluster(tmp_path / "SDS"))
    als = sds_cluster(tmp_path / "ALS")
    als.name = als.load_assignment.cluster_name = t.ALS_CLUSTER
    bootstrap.static_resources.clusters.append(als)
    listeners = b"".join(r.any_bytes for r in sets[LISTENER_TYPE].values())
    assert t.ALS_CLUSTER.encode() in listeners
    assert str(tmp_path / "METRICS").encode() in listeners
    result = validate(bootstrap, tmp_path / "envoy.json")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "deprecated" not in output.lower(), output
