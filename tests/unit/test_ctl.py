"""pilotfish-ctl's sans-IO parts: tables that fit, syncz folding, config-dump readers."""

from __future__ import annotations

import base64
import datetime as dt

from envoy.service.discovery.v3.discovery_pb2 import DiscoveryResponse
from envoy.service.status.v3 import csds_pb2

from control.ca.authority import in_memory_authority
from control.ctl import configdump, status, table
from protos import typeurls


def test_table_pads_without_trailing_spaces_and_fits_a_width() -> None:
    text = table.render(["A", "LONG"], [["x", "yy"], ["zzz", "w"]])
    assert text == "A    LONG\nx    yy\nzzz  w\n"
    wide = table.render(["NAME", "V"], [["n" * 60, "1"]], width=30)
    first, row = wide.splitlines()
    assert len(row) <= 30 and row.split()[0].endswith("…")
    # Piped (width None): nothing is shortened.
    assert "n" * 60 in table.render(["NAME", "V"], [["n" * 60, "1"]], None)


def _cc(node: str, replica: str, stream: str, types: dict[str, int]) -> csds_pb2.ClientConfig:
    cc = csds_pb2.ClientConfig()
    cc.node.id = node
    cc.node.metadata.update({"CONTROL_PLANE_ID": replica, "STREAM": stream})
    for t, st in types.items():
        g = cc.generic_xds_configs.add()
        g.type_url = t
        g.config_status = st
        g.version_info = "v1"
        if st == csds_pb2.ConfigStatus.ERROR:
            g.error_state.details = "bad listener"
    return cc


def test_syncz_streams_of_one_proxy_fold_into_one_row_worst_state_wins() -> None:
    node = "sidecar~10.0.0.1~a.default~default.svc.cluster.local"
    resp = DiscoveryResponse(type_url=typeurls.DEBUG_SYNCZ)
    synced, error = csds_pb2.ConfigStatus.SYNCED, csds_pb2.ConfigStatus.ERROR
    for cc in (
        _cc(node, "cp-1", "1", {typeurls.CLUSTER: synced, typeurls.LISTENER: error}),
        _cc(node, "cp-1", "2", {typeurls.NAME_TABLE: synced, typeurls.LISTENER: synced}),
        _cc("ctl~127.0.0.1~ctl.default~x", "cp-1", "3", {}),  # another ctl: no types
    ):
        resp.resources.add().Pack(cc)
    rows = status.proxy_rows(status.decode_syncz(resp, "addr"))
    assert len(rows) == 1
    row = rows[0]
    assert (row.name, row.ip, row.replica, row.streams) == ("a.default", "10.0.0.1", "cp-1", 2)
    assert row.states == {"CDS": "SYNCED", "LDS": "ERROR", "NDS": "SYNCED"}
    assert row.errors == {"LDS": "bad listener"}
    headers, body = status.table_rows(rows)
    assert body == [["a.default", "10.0.0.1", "cp-1", "SYNCED", "ERROR", "-", "-", "SYNCED"]]


def test_same_proxy_on_two_replicas_is_two_rows_and_excluded_ids_are_dropped() -> None:
    node = "sidecar~10.0.0.1~a.default~default.svc.cluster.local"
    synced = csds_pb2.ConfigStatus.SYNCED
    streams = [
        *status.decode_syncz(_resp(_cc(node, "cp-1", "1", {typeurls.CLUSTER: synced})), "x"),
        *status.decode_syncz(_resp(_cc(node, "cp-2", "1", {typeurls.CLUSTER: synced})), "y"),
    ]
    assert [r.replica for r in status.proxy_rows(streams)] == ["cp-1", "cp-2"]
    assert status.proxy_rows(streams, exclude=[node]) == []


def _resp(cc: csds_pb2.ClientConfig) -> DiscoveryResponse:
    resp = DiscoveryResponse()
    resp.resources.add().Pack(cc)
    return resp


def test_cluster_names_split_into_istio_columns_from_either_json_spelling() -> None:
    envoy_dump = {
        "configs": [
            {
                "@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
                "static_clusters": [{"cluster": {"name": "sds-grpc", "type": "STATIC"}}],
                "dynamic_active_clusters": [
                    {"cluster": {"name": "outbound|80|v1|web.ns.svc.cluster.local", "type": "EDS"}}
                ],
            }
        ]
    }
    resources = configdump.envoy_resources(envoy_dump, "clusters")
    headers, rows = configdump.table("clusters", resources)
    assert rows == [
        ["sds-grpc", "-", "-", "-", "STATIC"],
        ["web.ns.svc.cluster.local", "80", "v1", "outbound", "EDS"],
    ]
    control_dump = {
        "resources": {
            "LDS": [
                {
                    "name": "x",
                    "resource": {
                        "address": {"socketAddress": {"address": "10.0.0.1", "portValue": 80}},
                        "filterChains": [
                            {
                                "filters": [
                                    {
                                        "typedConfig": {
                                            "@type": "type.googleapis.com/envoy.extensions."
                                            "filters.network.tcp_proxy.v3.TcpProxy",
                                            "cluster": "outbound|80||db",
                                        }
                                    }
                                ]
                            }
                        ],
                    },
                }
            ]
        }
    }
    headers, rows = configdump.table(
        "listeners", configdump.control_resources(control_dump, "listeners")
    )
    assert rows == [["10.0.0.1", "80", "ALL", "Cluster: outbound|80||db"]]


def test_secret_rows_read_the_certificate() -> None:
    ca = in_memory_authority("cluster.local")
    pem = ca.root_pem.encode()
    resources = [
        {"name": "ROOTCA", "validation_context": {"trusted_ca": {"inline_bytes": _b64(pem)}}},
        {"name": "empty", "tls_certificate": {}},
    ]
    headers, rows = configdump.table("secret", resources)
    assert headers[:3] == ["RESOURCE NAME", "TYPE", "VALID"]
    assert rows[0][:4] == ["ROOTCA", "CA", "true", format(ca.root.serial_number, "x")]
    not_after = dt.datetime.strptime(rows[0][4], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    assert not_after == ca.root.not_valid_after_utc.replace(microsecond=0)
    assert rows[1] == ["empty", "Cert Chain", "-", "-", "-", "-"]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
