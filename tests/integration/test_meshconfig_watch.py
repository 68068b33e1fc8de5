"""The `--mesh-config` file watcher on a real file: a change is picked up; a bad version or a
missing file is an error (`file:line`) while the last good settings stay; a good version
clears it. Every change of state is told to the owner."""

from __future__ import annotations

from pathlib import Path

import pytest

from control.config.errors import ConfigError
from control.config.meshwatch import EffectiveMeshConfig, MeshConfigFile
from control.model.meshconfig import MeshOverrides, MeshSettings
from tests.support.controlplane import eventually


def write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


async def test_reload_bad_missing_and_good_again(tmp_path: Path) -> None:
    path = tmp_path / "mesh.yaml"
    path.write_text("accessLogFile: /a\n")
    watcher = MeshConfigFile(str(path), poll_interval=0.02, debounce=0.02)
    effective = EffectiveMeshConfig([watcher], MeshOverrides(trust_domain="cluster.local"))
    seen: list[MeshSettings] = []
    effective.subscribe(seen.append)
    await effective.start()
    try:
        assert effective.current.access_log_file == "/a"
        write(path, "accessLogFile: /b\n")
        await eventually(lambda: [s.access_log_file for s in seen] == ["/b"], timeout=10)

        write(path, "accessLogFile: /c\nenableTracing: sometimes\n")
        await eventually(lambda: effective.errors, timeout=10)
        (error,) = effective.errors.values()
        assert str(error).startswith(f"{path}:2: MeshConfig: enableTracing")
        assert effective.current.access_log_file == "/b"  # the last good one

        path.unlink()
        await eventually(lambda: "missing" in str(effective.errors.get(str(path))), timeout=10)
        assert effective.current.access_log_file == "/b"

        write(path, "accessLogFile: /d\n")
        await eventually(lambda: not effective.errors, timeout=10)
        assert [s.access_log_file for s in seen] == ["/b", "/d"]
        assert effective.status()["in_use"] == str(path)
    finally:
        await effective.close()


async def test_a_bad_file_at_start_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "mesh.yaml"
    path.write_text("defaultProviders: {tracing: zipkin}\n")
    with pytest.raises(ConfigError, match=r"mesh\.yaml:1: MeshConfig: defaultProviders\.tracing"):
        await EffectiveMeshConfig([MeshConfigFile(str(path))]).start()
    with pytest.raises(ConfigError, match="cannot read file"):
        await EffectiveMeshConfig([MeshConfigFile(str(tmp_path / "nope.yaml"))]).start()
