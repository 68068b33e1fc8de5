"""Hostile files in a `--config` directory: a YAML alias bomb ("billion laughs") is refused
with `file:line: reason` in bounded memory (at startup the real `pilotfish-control` exits with
that one line; on a hot reload the last good config keeps being served), and a symlink that
leads outside the directory is not followed (a clear one-line warning, once)."""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from control.config.discovery import _warned
from control.config.watcher import ConfigWatcher
from tests.support.controlplane import eventually, running_control_plane
from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]
SERVICE = """\
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  selector: {{app: {name}}}
  ports: [{{name: http, port: 9080}}]
"""
# A safety bound, not a measurement: an idle control plane that fails its config at startup
# peaks near 100 MB; the bomb below expands to 10^8 strings (gigabytes).
PEAK_RSS_BOUND = 300 << 20
# The child may not take the machine down if the guard is gone: it gets a MemoryError (a
# traceback, so the test fails) long before the machine runs out. Startup fails before any
# server starts, well within this.
ADDRESS_SPACE_LIMIT = 1 << 30


def billion_laughs(levels: int = 9, fanout: int = 10) -> str:
    lines = ['l0: &l0 "lol"']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fanout)}]")
    return "apiVersion: v1\nkind: Service\n" + "\n".join(lines) + f"\nspec: *l{levels - 1}\n"


def _limit_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))


def _services(watcher: ConfigWatcher) -> set[str]:
    return {s.name for s in watcher.current.services}


async def test_yaml_bomb_is_refused_at_startup_with_file_line_in_bounded_memory(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "a-good.yaml").write_text(SERVICE.format(name="good"))
    bomb = cfg / "bomb.yaml"
    bomb.write_text(billion_laughs())
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "control",
            "--config",
            str(cfg),
            "--state-dir",
            str(tmp_path / "state"),
            "--xds-address",
            f"127.0.0.1:{free_port()}",
            "--secure-xds-address",
            "off",
            "--webhook-address",
            "off",
            "--http-address",
            f"127.0.0.1:{free_port()}",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_limit_address_space,
    )
    try:
        # wait4: this child's own peak RSS (ru_maxrss, KB), not the largest of all children.
        _, status, usage = await asyncio.to_thread(os.wait4, proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        assert proc.stderr is not None
        err = proc.stderr.read().decode().strip()
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"pilotfish-control: {bomb}:"), err
    line = lines[0].removeprefix(f"pilotfish-control: {bomb}:").split(":", 1)[0]
    assert line.isdigit() and 1 <= int(line) <= billion_laughs().count("\n"), err
    assert "alias" in err, err
    assert usage.ru_maxrss * 1024 < PEAK_RSS_BOUND, usage.ru_maxrss


async def test_yaml_bomb_on_reload_keeps_the_last_good_config(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    mesh = cfg / "mesh.yaml"
    mesh.write_text(SERVICE.format(name="good"))
    async with running_control_plane(cfg) as cp:
        watcher = cp.watcher
        assert isinstance(watcher, ConfigWatcher)
        assert _services(watcher) == {"good"}
        # The good file is replaced by a bomb: refused, and its last good version stays.
        # 10^6 strings expanded: the guard refuses it as surely as the 10^8 one above, and
        # without the guard this process would only grow by some 100 MB (this test runs
        # in the test process, with no address-space limit).
        mesh.write_text(billion_laughs(7))
        err = await eventually(
            lambda: watcher.errors.get(str(mesh)), timeout=20, what="the bomb refused"
        )
        assert str(err).startswith(f"{mesh}:{err.line}: ") and err.line >= 1, err
        assert "alias" in err.reason, err
        assert _services(watcher) == {"good"}
        # Still watching: a good change afterwards is applied.
        mesh.write_text(SERVICE.format(name="better"))
        await eventually(lambda: _services(watcher) == {"better"}, timeout=20, what="reload")


async def test_symlinks_out_of_the_config_dir_are_not_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "secret.yaml").write_text(SERVICE.format(name="stolen-file"))
    (outside / "dir" / "more.yaml").write_text(SERVICE.format(name="stolen-dir"))
    cfg = tmp_path / "cfg"
    (cfg / "sub").mkdir(parents=True)
    (cfg / "mesh.yaml").write_text(SERVICE.format(name="good"))
    (cfg / "sub" / "real.yaml").write_text(SERVICE.format(name="inside"))
    os.symlink(outside / "secret.yaml", cfg / "secret.yaml")  # a file outside
    os.symlink(outside / "dir", cfg / "linked")  # a directory outside
    os.symlink("../../outside/secret.yaml", cfg / "sub" / "relative.yaml")  # ../ escapes too
    os.symlink("sub/real.yaml", cfg / "alias.yaml")  # inside: still followed
    _warned.clear()
    caplog.set_level(logging.WARNING, logger="control.config.discovery")
    async with running_control_plane(cfg) as cp:
        watcher = cp.watcher
        assert isinstance(watcher, ConfigWatcher)
        assert _services(watcher) == {"good", "inside"}
        assert str(cfg / "alias.yaml") in watcher.files or str(cfg / "sub/real.yaml") in (
            watcher.files
        )
        await asyncio.sleep(10 * 0.05)  # ten more scans of the directory
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for link, target in (
        (cfg / "secret.yaml", outside / "secret.yaml"),
        (cfg / "linked", outside / "dir"),
        (cfg / "sub" / "relative.yaml", outside / "secret.yaml"),
    ):
        said = [w for w in warnings if w.startswith(f"config: ignoring {link}:")]
        assert len(said) == 1, "\n".join(warnings)  # once, however often the directory is rescanned
        assert f"symlink to {target}, outside the config directory {cfg}" in said[0]
        assert "\n" not in said[0]
