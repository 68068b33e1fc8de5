"""Discovery, per-file loading and merging (control/config/loader.py, merge.py, discovery.py)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from control.config import (
    ConfigError,
    DuplicateObjectError,
    discover,
    load_file,
    load_paths,
    load_text,
    merge,
)
from control.model.types import MeshConfig


def write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return str(path)


def service(name: str, namespace: str = "default", port: int = 80) -> str:
    return (
        f"apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {namespace}\n"
        f"spec:\n  selector: {{app: {name}}}\n  ports:\n  - name: http\n    port: {port}\n"
    )


def service_entry(name: str, host: str) -> str:
    return (
        f"apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata:\n  name: {name}\n"
        f"spec:\n  hosts: [{host}]\n  ports: [{{number: 443, name: tls, protocol: TLS}}]\n"
    )


# --- discover --------------------------------------------------------------------------------


def test_discover_recursive_sorted_and_filtered(tmp_path: Path) -> None:
    write(tmp_path / "b.yaml", "")
    write(tmp_path / "a.yml", "")
    write(tmp_path / "sub" / "c.json", "{}")
    write(tmp_path / "sub" / "deeper" / "d.YAML", "")
    write(tmp_path / "README.md", "")
    write(tmp_path / "notes.txt", "")
    write(tmp_path / ".hidden.yaml", "")
    write(tmp_path / ".git" / "config.yaml", "")
    found = discover([str(tmp_path)])
    assert found == [
        str(tmp_path / "a.yml"),
        str(tmp_path / "b.yaml"),
        str(tmp_path / "sub" / "c.json"),
        str(tmp_path / "sub" / "deeper" / "d.YAML"),
    ]
    assert discover([str(tmp_path)]) == found  # deterministic


def test_discover_takes_named_files_whatever_their_suffix_and_dedupes(tmp_path: Path) -> None:
    conf = write(tmp_path / "mesh.conf", "")
    svc = write(tmp_path / "svc.yaml", "")
    assert discover([conf, svc, str(tmp_path), f"{tmp_path}/./svc.yaml"]) == [conf, svc]


def test_discover_configmap_volume_layout(tmp_path: Path) -> None:
    # kubelet mounts ConfigMaps as ..data -> ..2024_x/ with visible symlinks to ..data/<key>.
    real = tmp_path / "..2024_05_01_10_00_00.123"
    write(real / "mesh.yaml", service("web"))
    os.symlink(real.name, tmp_path / "..data")
    os.symlink("..data/mesh.yaml", tmp_path / "mesh.yaml")
    assert discover([str(tmp_path)]) == [str(tmp_path / "mesh.yaml")]


def test_discover_survives_symlink_loops(tmp_path: Path) -> None:
    write(tmp_path / "a" / "x.yaml", "")
    os.symlink("..", tmp_path / "a" / "loop")
    assert discover([str(tmp_path)]) == [str(tmp_path / "a" / "x.yaml")]


def test_discover_missing_path(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope")
    with pytest.raises(ConfigError) as info:
        discover([missing])
    assert str(info.value) == f"{missing}:1: no such file or directory"
    assert discover([missing], missing_ok=True) == []


# --- load_file -------------------------------------------------------------------------------


def test_load_file_mixed_manifests(tmp_path: Path) -> None:
    manifests = textwrap.dedent(
        """
        apiVersion: apps/v1
        kind: Deployment
        metadata: {name: web}
        spec: {replicas: 2}
        ---
        apiVersion: networking.istio.io/v1
        kind: EnvoyFilter
        metadata: {name: web}
        spec: {configPatches: []}
        ---
        """
    ).lstrip("\n")
    path = write(tmp_path / "app.yaml", manifests + service("web"))
    fc = load_file(path)
    assert fc.path == path
    assert [o.source.kind for o in fc.objects] == ["Service"]
    assert [str(w) for w in fc.warnings] == [
        f"Deployment default/web ({path}:1): kind Deployment (apiVersion apps/v1) is not "
        "supported; ignored",
        f"EnvoyFilter default/web ({path}:6): kind EnvoyFilter (apiVersion "
        "networking.istio.io/v1) is not supported; ignored",
    ]


def test_load_file_unreadable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_file(str(tmp_path / "gone.yaml"))
    assert (
        str(info.value)
        == f"{tmp_path / 'gone.yaml'}:1: cannot read file: No such file or directory"
    )
    with pytest.raises(ConfigError) as info:
        load_file(str(tmp_path))
    assert info.value.reason == "is a directory, expected a file"


def test_duplicate_object_in_one_file(tmp_path: Path) -> None:
    path = write(tmp_path / "dup.yaml", service("web") + "---\n" + service("web", port=81))
    with pytest.raises(DuplicateObjectError) as info:
        load_file(path)
    assert str(info.value) == (
        f"{path}:12: duplicate Service default/web: already defined at {path}:1"
    )
    assert (info.value.first_file, info.value.first_line) == (path, 1)


def test_same_name_in_other_namespace_or_kind_is_not_a_duplicate() -> None:
    text = "---\n".join(
        [service("web"), service("web", namespace="prod"), service_entry("web", "web.example.com")]
    )
    assert len(load_text(text, "f.yaml").objects) == 3


# --- merge -----------------------------------------------------------------------------------


def test_merge_orders_by_file_and_line_and_keeps_raw(tmp_path: Path) -> None:
    b = write(tmp_path / "b.yaml", service("zeta") + "---\n" + service("alpha"))
    a = write(tmp_path / "a.yaml", service("mid"))
    mesh = merge([load_file(b), load_file(a)])
    assert [s.name for s in mesh.services] == ["mid", "zeta", "alpha"]
    assert [(ref.file, ref.line) for ref, _ in mesh.raw] == [(a, 1), (b, 1), (b, 12)]
    assert mesh.raw[0][1]["metadata"] == {"name": "mid", "namespace": "default"}


def test_duplicate_object_across_files_names_both_places(tmp_path: Path) -> None:
    a = write(tmp_path / "a.yaml", "# first\n" + service("web"))
    b = write(tmp_path / "b.yaml", service("other") + "---\n" + service("web"))
    with pytest.raises(DuplicateObjectError) as info:
        merge([load_file(b), load_file(a)])
    assert str(info.value) == f"{b}:12: duplicate Service default/web: already defined at {a}:2"


def test_same_host_twice_first_wins_with_a_warning(tmp_path: Path) -> None:
    a = write(tmp_path / "a.yaml", service_entry("first", "api.example.com"))
    b = write(tmp_path / "b.yaml", service_entry("second", "api.example.com"))
    mesh = merge([load_file(b), load_file(a)])
    assert [s.name for s in mesh.services] == ["first"]
    assert [str(w) for w in mesh.warnings] == [
        f"ServiceEntry default/second ({b}:1): host api.example.com is already defined by "
        f"ServiceEntry default/first ({a}:1); this definition is ignored"
    ]


def test_service_entry_for_a_kubernetes_hostname_conflicts_with_the_service(
    tmp_path: Path,
) -> None:
    a = write(tmp_path / "a.yaml", service("web"))
    b = write(tmp_path / "b.yaml", service_entry("web-se", "web.default.svc.cluster.local"))
    mesh = merge([load_file(a), load_file(b)])
    assert [s.registry for s in mesh.services] == ["Kubernetes"]
    assert "is already defined by Service default/web" in mesh.warnings[0].message


def test_two_namespace_wide_sidecars_warn(tmp_path: Path) -> None:
    sidecar = (
        "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {{name: {}}}\n"
        "spec:\n  egress: [{{hosts: ['./*']}}]\n"
    )
    path = write(tmp_path / "sc.yaml", sidecar.format("zz") + "---\n" + sidecar.format("aa"))
    mesh = merge([load_file(path)])
    assert len(mesh.sidecars) == 2
    assert [str(w) for w in mesh.warnings] == [
        f"Sidecar default/zz ({path}:1): namespace default has more than one Sidecar without "
        f"workloadSelector; only Sidecar default/aa ({path}:7) is used"
    ]


def test_merge_equality_ignores_raw_and_warnings(tmp_path: Path) -> None:
    plain = write(tmp_path / "a.yaml", service("web"))
    noisy = write(tmp_path / "b" / "a.yaml", service("web") + "  foo: bar\n")
    one, two = merge([load_file(plain)]), merge([load_file(noisy)])
    assert one.warnings == () and len(two.warnings) == 1
    # Where an object sits (file, line) is not part of its value: moving it is no change.
    assert one == two
    commented = load_text("# a comment\n" + service("web"), plain)
    assert merge([commented]) == one
    assert merge([commented]).services[0].source.line != one.services[0].source.line
    same = load_text(service("web") + "# trailing comment\n", plain)
    assert merge([same]) == one


def test_load_paths(tmp_path: Path) -> None:
    write(tmp_path / "svc" / "web.yaml", service("web"))
    write(tmp_path / "svc" / "db.yaml", service("db"))
    write(
        tmp_path / "istio" / "vm.yaml",
        """
        apiVersion: networking.istio.io/v1
        kind: WorkloadEntry
        metadata: {name: db-vm}
        spec:
          address: 127.0.1.9
          labels: {app: db}
        """,
    )
    mesh = load_paths([str(tmp_path)])
    assert isinstance(mesh, MeshConfig)
    assert [s.name for s in mesh.services] == ["db", "web"]
    assert [w.name for w in mesh.workload_entries] == ["db-vm"]
    assert load_paths([str(tmp_path)]) == mesh


def test_load_paths_raises_on_the_first_bad_file(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", service("web"))
    bad = write(tmp_path / "b.yaml", service("db", port=0))
    write(tmp_path / "c.yaml", "a: [\n")
    with pytest.raises(ConfigError) as info:
        load_paths([str(tmp_path)])
    assert str(info.value) == (
        f"{bad}:10: Service default/db: spec.ports[0].port: must be an integer 1-65535"
    )
