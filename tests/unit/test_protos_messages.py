"""protos/messages.py: any generated type by its type URL, importing only what defines it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from protos.messages import UnknownMessageType, full_name, message_class

ROOT = Path(__file__).resolve().parents[2]


def test_full_name_accepts_type_urls_of_any_host_and_bare_names() -> None:
    assert full_name("type.googleapis.com/a.b.C") == "a.b.C"
    assert full_name("example.com/x/a.b.C") == "a.b.C"
    assert full_name("a.b.C") == "a.b.C"


def _fresh(code: str) -> dict[str, object]:
    """Run `code` in a new interpreter (nothing imported yet); it prints one JSON object."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_a_type_nothing_imported_is_found_and_only_its_module_is_imported() -> None:
    result = _fresh(
        """
        import json, sys
        before = {m for m in sys.modules if m.endswith("_pb2")}
        from protos.messages import message_class
        url = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"
        was = "envoy.config.core.v3.extension_pb2" in sys.modules
        cls = message_class(url)
        new = sorted({m for m in sys.modules if m.endswith("_pb2")} - before)
        print(json.dumps({"was": was, "module": cls.__module__,
                          "name": cls.DESCRIPTOR.full_name, "new": new}))
        """
    )
    assert result["was"] is False
    assert result["module"] == "envoy.config.core.v3.extension_pb2"
    assert result["name"] == "envoy.config.core.v3.TypedExtensionConfig"
    new = result["new"]
    assert isinstance(new, list)
    # The defining module and what it imports, not the package's other modules (the package
    # has 20, xds-protos about 640).
    assert "envoy.config.core.v3.extension_pb2" in new
    assert "envoy.config.core.v3.health_check_pb2" not in new
    assert len(new) < 20, new


@pytest.mark.parametrize(
    ("type_url", "module"),
    [
        (
            "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            "envoy.config.cluster.v3.cluster_pb2",
        ),
        (
            "type.googleapis.com/envoy.config.listener.v3.Listener",
            "envoy.config.listener.v3.listener_pb2",
        ),
        (
            "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
            "envoy.config.route.v3.route_pb2",
        ),
        (
            "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
            "envoy.config.endpoint.v3.endpoint_pb2",
        ),
        (
            "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "envoy.extensions.filters.http.wasm.v3.wasm_pb2",
        ),
        ("type.googleapis.com/xds.type.v3.TypedStruct", "xds.type.v3.typed_struct_pb2"),
        ("type.googleapis.com/google.protobuf.Duration", "google.protobuf.duration_pb2"),
        ("envoy.config.cluster.v3.Cluster.LbSubsetConfig", "envoy.config.cluster.v3.cluster_pb2"),
        ("type.googleapis.com/istio.networking.nds.v1.NameTable", "protos.nds_pb2"),
        ("type.googleapis.com/pilotfish.health.v1.WorkloadProbe", "protos.probe_pb2"),
    ],
)
def test_types_resolve_to_their_defining_module(type_url: str, module: str) -> None:
    cls = message_class(type_url)
    assert cls.__module__ == module
    assert cls.DESCRIPTOR.full_name == full_name(type_url)


@pytest.mark.parametrize(
    "type_url",
    [
        "type.googleapis.com/envoy.config.cluster.v3.Clustr",
        "type.googleapis.com/no.such.package.Thing",
        "type.googleapis.com/os.path",  # an importable module, not a message
        "type.googleapis.com/",
        "type.googleapis.com/envoy..Cluster",
    ],
)
def test_unknown_types_raise_naming_the_type(type_url: str) -> None:
    with pytest.raises(UnknownMessageType) as e:
        message_class(type_url)
    assert repr(type_url) in str(e.value)
    assert e.value.type_url == type_url
