"""Tests for protos/: generated code freshness, Istio wire compatibility, wire.py, type URLs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2, descriptor, struct_pb2, wrappers_pb2

from protos import ca_pb2, ca_pb2_grpc, nds_pb2, typeurls, wire
from tests.support.wire import (
    delta_discovery_response,
    discovery_response,
    field_bytes,
    field_string,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
BIG = bytes(range(256)) * 80  # 20 KiB: lengths need 3-byte varints
FD = descriptor.FieldDescriptor


def fields(message: Any) -> dict[str, tuple[int, int, bool]]:
    """name -> (number, type, repeated) from a message class's descriptor."""
    return {f.name: (f.number, f.type, f.is_repeated) for f in message.DESCRIPTOR.fields}


# --- generated code -------------------------------------------------------------------------


def test_generated_code_is_up_to_date() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "protos.generate", "--check"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_generated_modules_import_as_package() -> None:
    assert ca_pb2.IstioCertificateRequest.__module__ == "protos.ca_pb2"
    assert nds_pb2.NameTable.__module__ == "protos.nds_pb2"
    assert vars(ca_pb2_grpc)["ca__pb2"] is ca_pb2


# --- ca.proto: wire compatibility with Istio's istio.v1.auth --------------------------------


def test_ca_messages_match_istio_field_numbers() -> None:
    assert ca_pb2.DESCRIPTOR.package == "istio.v1.auth"
    assert fields(ca_pb2.IstioCertificateRequest) == {
        "csr": (1, FD.TYPE_STRING, False),
        "validity_duration": (3, FD.TYPE_INT64, False),
        "metadata": (4, FD.TYPE_MESSAGE, False),
    }
    metadata = ca_pb2.IstioCertificateRequest.DESCRIPTOR.fields_by_name["metadata"]
    assert metadata.message_type.full_name == "google.protobuf.Struct"
    assert fields(ca_pb2.IstioCertificateResponse) == {"cert_chain": (1, FD.TYPE_STRING, True)}


def test_ca_request_round_trips() -> None:
    metadata = struct_pb2.Struct()
    metadata.update({"WorkloadName": "reviews-v1", "ClusterID": "Kubernetes"})
    req = ca_pb2.IstioCertificateRequest(
        csr="-----BEGIN CERTIFICATE REQUEST-----\n…", validity_duration=86400, metadata=metadata
    )
    assert ca_pb2.IstioCertificateRequest.FromString(req.SerializeToString()) == req
    resp = ca_pb2.IstioCertificateResponse(cert_chain=["leaf", "intermediate", "root"])
    assert ca_pb2.IstioCertificateResponse.FromString(resp.SerializeToString()) == resp


class RecordingChannel:
    """Stands in for grpc.Channel: records the method paths a stub registers."""

    def __init__(self) -> None:
        self.methods: list[str] = []

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> str:
        self.methods.append(method)
        return method


def test_ca_grpc_stub_and_method_name() -> None:
    channel = RecordingChannel()
    stub = ca_pb2_grpc.IstioCertificateServiceStub(channel)
    full_name = "/istio.v1.auth.IstioCertificateService/CreateCertificate"
    assert channel.methods == [full_name]
    assert stub.CreateCertificate == full_name
    assert hasattr(ca_pb2_grpc, "IstioCertificateServiceServicer")
    assert hasattr(ca_pb2_grpc, "add_IstioCertificateServiceServicer_to_server")
    service = ca_pb2.DESCRIPTOR.services_by_name["IstioCertificateService"]
    method = service.methods_by_name["CreateCertificate"]
    assert method.input_type is ca_pb2.IstioCertificateRequest.DESCRIPTOR
    assert method.output_type is ca_pb2.IstioCertificateResponse.DESCRIPTOR


# --- nds.proto: wire compatibility with Istio's istio.networking.nds.v1 ---------------------


def test_name_table_matches_istio_field_numbers() -> None:
    assert nds_pb2.NameTable.DESCRIPTOR.full_name == "istio.networking.nds.v1.NameTable"
    table = fields(nds_pb2.NameTable)
    assert table["table"][0] == 1 and table["table"][2]  # map<> is a repeated entry message
    assert table["name_info"] == (2, FD.TYPE_MESSAGE, False)
    assert fields(nds_pb2.NameTable.NameInfo) == {
        "ips": (1, FD.TYPE_STRING, True),
        "registry": (2, FD.TYPE_STRING, False),
        "shortname": (3, FD.TYPE_STRING, False),
        "namespace": (4, FD.TYPE_STRING, False),
        "alt_hosts": (5, FD.TYPE_STRING, True),
    }


def test_name_table_round_trips() -> None:
    nt = nds_pb2.NameTable()
    info = nt.table["reviews.default.svc.cluster.local"]
    info.ips.extend(["10.0.0.7", "fd00::7"])
    info.registry = "Kubernetes"
    info.shortname = "reviews"
    info.namespace = "default"
    nt.table["ünïcode.example"].ips.append("192.0.2.1")
    wire_bytes = nt.SerializeToString()
    parsed = nds_pb2.NameTable.FromString(wire_bytes)
    assert parsed == nt
    assert list(parsed.table["reviews.default.svc.cluster.local"].ips) == ["10.0.0.7", "fd00::7"]
    # ... and through an Any with our type URL, as it travels inside a DiscoveryResponse.
    packed = any_pb2.Any.FromString(wire.any_bytes(typeurls.NAME_TABLE, wire_bytes))
    out = nds_pb2.NameTable()
    assert packed.Unpack(out) and out == nt


# --- wire.py ------------------------------------------------------------------------------


def test_wire_field_numbers_match_envoy_descriptors() -> None:
    dr = discovery_pb2.DiscoveryResponse.DESCRIPTOR.fields_by_name
    ddr = discovery_pb2.DeltaDiscoveryResponse.DESCRIPTOR.fields_by_name
    res = discovery_pb2.Resource.DESCRIPTOR.fields_by_name
    anyf = any_pb2.Any.DESCRIPTOR.fields_by_name
    # Pairs, not a dict: many constants share a number (1 is a field of every message), and
    # a dict keyed by them would keep only the last of each.
    expected = [
        (wire.ANY_TYPE_URL, anyf["type_url"]),
        (wire.ANY_VALUE, anyf["value"]),
        (wire.DR_VERSION_INFO, dr["version_info"]),
        (wire.DR_RESOURCES, dr["resources"]),
        (wire.DR_TYPE_URL, dr["type_url"]),
        (wire.DR_NONCE, dr["nonce"]),
        (wire.DR_CONTROL_PLANE, dr["control_plane"]),
        (wire.DDR_SYSTEM_VERSION_INFO, ddr["system_version_info"]),
        (wire.DDR_RESOURCES, ddr["resources"]),
        (wire.DDR_TYPE_URL, ddr["type_url"]),
        (wire.DDR_NONCE, ddr["nonce"]),
        (wire.DDR_REMOVED_RESOURCES, ddr["removed_resources"]),
        (wire.DDR_CONTROL_PLANE, ddr["control_plane"]),
        (wire.RES_VERSION, res["version"]),
        (wire.RES_RESOURCE, res["resource"]),
        (wire.RES_NAME, res["name"]),
    ]
    for number, field in expected:
        assert number == field.number, field.full_name
    req = discovery_pb2.DiscoveryRequest.DESCRIPTOR.fields_by_name
    for number, name in (
        (wire.DREQ_VERSION_INFO, "version_info"),
        (wire.DREQ_NODE, "node"),
        (wire.DREQ_RESOURCE_NAMES, "resource_names"),
        (wire.DREQ_TYPE_URL, "type_url"),
        (wire.DREQ_RESPONSE_NONCE, "response_nonce"),
    ):
        assert number == req[name].number, name
    assert dr["control_plane"].message_type.full_name == "envoy.config.core.v3.ControlPlane"


@pytest.mark.parametrize(
    "n", [1, 127, 128, 300, 16383, 16384, 2**21, 2**32 - 1, 2**63 - 1, 2**64 - 1]
)
def test_varint_matches_protobuf(n: int) -> None:
    # (proto3 drops a zero value, so 0 is checked in test_field_helpers)
    assert b"\x08" + wire.varint(n) == wrappers_pb2.UInt64Value(value=n).SerializeToString()


@pytest.mark.parametrize("n", [-1, -300, -(2**63)])
def test_varint_negative_is_int64_twos_complement(n: int) -> None:
    assert b"\x08" + wire.varint(n) == wrappers_pb2.Int64Value(value=n).SerializeToString()


def test_field_helpers() -> None:
    assert wire.varint(0) == b"\x00"
    assert field_bytes(1, b"") == b"\x0a\x00"
    assert field_string(2, "é") == b"\x12\x02\xc3\xa9"
    assert field_bytes(16, b"x") == b"\x82\x01\x01x"  # two-byte tag
    big = field_bytes(2, BIG)
    assert big[:4] == b"\x12" + wire.varint(len(BIG)) and big[4:] == BIG
    with pytest.raises(ValueError):
        field_bytes(0, b"")


@pytest.mark.parametrize(
    ("type_url", "value"),
    [("", b""), (typeurls.CLUSTER, b""), ("", b"\x00"), (typeurls.CLUSTER, BIG), ("t/ü", b"v")],
)
def test_any_bytes_matches_protobuf(type_url: str, value: bytes) -> None:
    ours = wire.any_bytes(type_url, value)
    expected = any_pb2.Any(type_url=type_url, value=value)
    assert any_pb2.Any.FromString(ours) == expected
    assert ours == expected.SerializeToString()


def packed(msg: Any) -> any_pb2.Any:
    a = any_pb2.Any()
    a.Pack(msg)
    return a


CLUSTERS = [
    cluster_pb2.Cluster(name="outbound|9080||reviews.default.svc.cluster.local"),
    cluster_pb2.Cluster(name="ünïcode-集群", alt_stat_name="x" * 40_000),  # > 16 KiB
    cluster_pb2.Cluster(),  # empty message: Any.value is empty
]
CONTROL_PLANE = base_pb2.ControlPlane(identifier="pilotfish-0")


@pytest.mark.parametrize(
    ("version", "resources", "type_url", "nonce", "control_plane"),
    [
        ("", [], "", "", None),  # everything empty: zero bytes on the wire
        ("v1", [packed(c) for c in CLUSTERS], typeurls.CLUSTER, "n-1", CONTROL_PLANE),
        ("ünï-2024", [packed(CLUSTERS[1])], typeurls.CLUSTER, "nönce", None),
        ("v2", [any_pb2.Any()], typeurls.CLUSTER, "n", base_pb2.ControlPlane()),  # empty Any
        ("v3", [], typeurls.ENDPOINT, "n-3", None),  # removal of everything in SotW
    ],
)
def test_discovery_response_matches_protobuf(
    version: str,
    resources: list[any_pb2.Any],
    type_url: str,
    nonce: str,
    control_plane: base_pb2.ControlPlane | None,
) -> None:
    cp_bytes = None if control_plane is None else control_plane.SerializeToString()
    ours = discovery_response(
        version, [r.SerializeToString() for r in resources], type_url, nonce, cp_bytes
    )
    expected = discovery_pb2.DiscoveryResponse(
        version_info=version, resources=resources, type_url=type_url, nonce=nonce
    )
    if control_plane is not None:
        expected.control_plane.CopyFrom(control_plane)
    parsed = discovery_pb2.DiscoveryResponse.FromString(ours)
    assert parsed == expected
    assert parsed.HasField("control_plane") == (control_plane is not None)
    # Stronger: byte-identical to protobuf's own (field-number ordered) serialization.
    assert ours == expected.SerializeToString(deterministic=True)


def test_any_bytes_equals_any_pack() -> None:
    for c in CLUSTERS:
        ours = wire.any_bytes(typeurls.CLUSTER, c.SerializeToString())
        assert ours == packed(c).SerializeToString()


@pytest.mark.parametrize(
    ("name", "version", "msg"),
    [
        ("outbound|9080||reviews", "v1", CLUSTERS[0]),
        ("ünïcode-集群", "vü", CLUSTERS[1]),
        ("", "", CLUSTERS[2]),
        ("no-body", "v1", None),  # resource field unset
    ],
)
def test_delta_resource_matches_protobuf(
    name: str, version: str, msg: cluster_pb2.Cluster | None
) -> None:
    payload = b"" if msg is None else packed(msg).SerializeToString()
    ours = wire.delta_resource(name, version, payload)
    expected = discovery_pb2.Resource(name=name, version=version)
    if msg is not None:
        expected.resource.CopyFrom(packed(msg))
    parsed = discovery_pb2.Resource.FromString(ours)
    assert parsed == expected
    assert parsed.HasField("resource") == (msg is not None)
    assert ours == expected.SerializeToString(deterministic=True)


@pytest.mark.parametrize(
    ("version", "resources", "removed", "nonce", "control_plane"),
    [
        ("", [], [], "", None),
        (
            "sys-1",
            [("a", "1", CLUSTERS[0]), ("ünï", "2", CLUSTERS[1]), ("e", "", CLUSTERS[2])],
            ["gone", "göne-2", ""],
            "n-1",
            CONTROL_PLANE,
        ),
        ("sys-2", [], ["only-removals"], "n-2", base_pb2.ControlPlane()),
    ],
)
def test_delta_discovery_response_matches_protobuf(
    version: str,
    resources: list[tuple[str, str, cluster_pb2.Cluster]],
    removed: list[str],
    nonce: str,
    control_plane: base_pb2.ControlPlane | None,
) -> None:
    cp_bytes = None if control_plane is None else control_plane.SerializeToString()
    ours = delta_discovery_response(
        version,
        [wire.delta_resource(n, v, packed(m).SerializeToString()) for n, v, m in resources],
        typeurls.CLUSTER,
        removed,
        nonce,
        cp_bytes,
    )
    expected = discovery_pb2.DeltaDiscoveryResponse(
        system_version_info=version,
        resources=[
            discovery_pb2.Resource(name=n, version=v, resource=packed(m)) for n, v, m in resources
        ],
        type_url=typeurls.CLUSTER,
        removed_resources=removed,
        nonce=nonce,
    )
    if control_plane is not None:
        expected.control_plane.CopyFrom(control_plane)
    parsed = discovery_pb2.DeltaDiscoveryResponse.FromString(ours)
    assert parsed == expected
    assert parsed.HasField("control_plane") == (control_plane is not None)
    assert ours == expected.SerializeToString(deterministic=True)


def test_delta_discovery_response_rejects_str_for_removed() -> None:
    with pytest.raises(TypeError):
        delta_discovery_response("", [], typeurls.CLUSTER, "oops", "")


# --- typeurls.py --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (typeurls.LISTENER, listener_pb2.Listener),
        (typeurls.CLUSTER, cluster_pb2.Cluster),
        (typeurls.ENDPOINT, endpoint_pb2.ClusterLoadAssignment),
        (typeurls.ROUTE, route_pb2.RouteConfiguration),
        (typeurls.SECRET, secret_pb2.Secret),
        (typeurls.NAME_TABLE, nds_pb2.NameTable),
    ],
)
def test_type_urls_name_real_messages(url: str, message: Any) -> None:
    assert url == "type.googleapis.com/" + message.DESCRIPTOR.full_name
    assert packed(message()).type_url == url


def test_type_url_tables() -> None:
    assert typeurls.PROXY_CONFIG == "type.googleapis.com/istio.mesh.v1alpha1.ProxyConfig"
    assert typeurls.DEBUG_SYNCZ == "istio.io/debug/syncz"
    assert typeurls.SOTW_PUSH_ORDER == (
        typeurls.CLUSTER,
        typeurls.ENDPOINT,
        typeurls.LISTENER,
        typeurls.ROUTE,
        typeurls.SECRET,
        typeurls.NAME_TABLE,
    )
    assert set(typeurls.SOTW_PUSH_ORDER) <= set(typeurls.SHORT_NAMES)
    assert len(set(typeurls.SHORT_NAMES.values())) == len(typeurls.SHORT_NAMES)
    assert typeurls.SHORT_NAMES[typeurls.NAME_TABLE] == "NDS"
    assert typeurls.SHORT_NAMES[typeurls.DEBUG_SYNCZ] == "SYNCZ"
