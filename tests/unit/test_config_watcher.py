"""ConfigWatcher: hot reload with per-file last good config (control/config/watcher.py)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from control.config import ConfigError, ConfigWatcher
from control.config import watcher as watcher_module
from control.config.watcher import OnChange
from control.model.types import MeshConfig
from tests.support.gatewayapi import dump, gateway, gateway_class, route
from tests.support.gatewayapi import service as api_service


def watch(paths: list[str], on_change: OnChange) -> ConfigWatcher:
    """A watcher with short debounce/poll intervals for tests."""
    return ConfigWatcher(paths, on_change, debounce=0.02, poll_interval=0.02)


def service(name: str, port: int = 80, extra: str = "") -> str:
    return (
        f"apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n"
        f"spec:\n  selector: {{app: {name}}}\n  ports:\n  - name: http\n    port: {port}\n{extra}"
    )


def workload_entry(name: str, address: str) -> str:
    return (
        f"apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {{name: {name}}}\n"
        f"spec:\n  address: {address}\n  labels: {{app: {name}}}\n"
    )


async def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


class Recorder:
    """An async on_change callback that keeps what it was given."""

    def __init__(self) -> None:
        self.configs: list[MeshConfig] = []

    async def __call__(self, config: MeshConfig) -> None:
        self.configs.append(config)

    @property
    def last(self) -> MeshConfig:
        return self.configs[-1]


def names(config: MeshConfig) -> list[str]:
    return sorted(s.name for s in config.services)


def ports(config: MeshConfig, name: str) -> list[int]:
    (svc,) = [s for s in config.services if s.name == name]
    return [p.port for p in svc.ports]


async def test_start_loads_everything_and_reloads_a_changed_file(tmp_path: Path) -> None:
    (tmp_path / "web.yaml").write_text(service("web", 80))
    (tmp_path / "db.yaml").write_text(service("db", 5432))
    changes = Recorder()
    async with watch([str(tmp_path)], changes) as watcher:
        assert names(watcher.current) == ["db", "web"]
        assert changes.configs == []  # not called for the initial load
        assert watcher.errors == {}

        (tmp_path / "web.yaml").write_text(service("web", 8080))
        await wait_for(lambda: len(changes.configs) == 1)
        assert ports(changes.last, "web") == [8080]
        assert ports(changes.last, "db") == [5432]
        assert watcher.current == changes.last
        assert watcher.reloads == 1


async def test_broken_file_keeps_its_last_good_version(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="control.config")
    web = tmp_path / "web.yaml"
    db = tmp_path / "db.yaml"
    web.write_text(service("web", 80))
    db.write_text(service("db", 5432))
    changes = Recorder()
    async with watch([str(tmp_path)], changes) as watcher:
        before = watcher.current

        # Break web.yaml: a YAML syntax error on line 7.
        web.write_text(service("web", 80).replace("  ports:\n", "  ports: [\n"))
        await wait_for(lambda: str(web) in watcher.errors)
        err = watcher.errors[str(web)]
        assert isinstance(err, ConfigError)
        assert (err.file, err.line) == (str(web), 8)
        assert err.reason.startswith("invalid YAML")
        assert watcher.current == before  # old objects of web.yaml still served
        assert changes.configs == []  # nothing changed, so nobody is told

        # Other files still update while web.yaml is broken.
        db.write_text(service("db", 6543))
        await wait_for(lambda: len(changes.configs) == 1)
        assert ports(watcher.current, "db") == [6543]
        assert ports(watcher.current, "web") == [80]
        assert str(web) in watcher.errors

        # Now a validation error (not syntax): the field's line is reported.
        web.write_text(service("web", 99999))
        await wait_for(lambda: watcher.errors.get(str(web), err) != err)
        assert str(watcher.errors[str(web)]) == (
            f"{web}:9: Service default/web: spec.ports[0].port: must be an integer 1-65535"
        )
        assert ports(watcher.current, "web") == [80]

        # Fix it.
        web.write_text(service("web", 81))
        await wait_for(lambda: len(changes.configs) == 2)
        assert watcher.errors == {}
        assert ports(watcher.current, "web") == [81]

    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    # One error per distinct problem, however many polls saw the broken file.
    assert [r.getMessage().rsplit(" (", 1)[0] for r in errors] == [
        str(err),
        f"{web}:9: Service default/web: spec.ports[0].port: must be an integer 1-65535",
    ]
    assert "keeping its last good version" in errors[0].getMessage()


async def test_added_and_deleted_files(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "web.yaml").write_text(service("web"))
    changes = Recorder()
    async with watch([str(conf)], changes) as watcher:
        nested = conf / "team-a" / "vm.yaml"
        nested.parent.mkdir()
        nested.write_text(workload_entry("vm-1", "127.0.1.5"))
        await wait_for(lambda: len(changes.configs) == 1)
        assert [w.name for w in watcher.current.workload_entries] == ["vm-1"]
        assert watcher.files == [str(conf / "team-a" / "vm.yaml"), str(conf / "web.yaml")]

        # A non-config file is not picked up.
        (conf / "notes.txt").write_text("not config")
        (conf / "web.yaml").unlink()
        await wait_for(lambda: len(changes.configs) == 2)
        assert names(watcher.current) == []
        assert [w.name for w in watcher.current.workload_entries] == ["vm-1"]
        assert watcher.files == [str(nested)]


async def test_deleting_a_broken_file_clears_its_error(tmp_path: Path) -> None:
    (tmp_path / "web.yaml").write_text(service("web"))
    changes = Recorder()
    async with watch([str(tmp_path)], changes) as watcher:
        bad = tmp_path / "new.yaml"
        bad.write_text("apiVersion: v1\nkind: Service\nmetadata: {}\n")
        await wait_for(lambda: str(bad) in watcher.errors)
        assert str(watcher.errors[str(bad)]) == f"{bad}:3: metadata.name: is required"
        assert changes.configs == []  # a new broken file contributes nothing
        bad.unlink()
        await wait_for(lambda: watcher.errors == {})
        assert names(watcher.current) == ["web"]


async def test_bad_file_at_startup_raises(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(service("web"))
    (tmp_path / "b.yaml").write_text(service("db", 0))
    watcher = watch([str(tmp_path)], Recorder())
    with pytest.raises(ConfigError) as info:
        await watcher.start()
    assert str(info.value) == (
        f"{tmp_path / 'b.yaml'}:9: Service default/db: spec.ports[0].port: "
        "must be an integer 1-65535"
    )
    await watcher.close()


async def test_missing_path_at_startup_raises(tmp_path: Path) -> None:
    watcher = watch([str(tmp_path / "nope")], Recorder())
    with pytest.raises(ConfigError, match="no such file or directory"):
        await watcher.start()


async def test_duplicate_across_files_rejects_the_new_version_until_resolved(
    tmp_path: Path,
) -> None:
    a = tmp_path / "a.yaml"
    b = tmp_path / "b.yaml"
    a.write_text(service("web", 80))
    b.write_text(service("db", 5432))
    changes = Recorder()
    async with watch([str(tmp_path)], changes) as watcher:
        # b.yaml now also defines Service web: b's new version is rejected, a's web stays.
        b.write_text(service("db", 5432) + "---\n" + service("web", 9999))
        await wait_for(lambda: str(b) in watcher.errors)
        assert str(watcher.errors[str(b)]) == (
            f"{b}:11: duplicate Service default/web: already defined at {a}:1"
        )
        assert ports(watcher.current, "web") == [80]
        assert names(watcher.current) == ["db", "web"]

        # Removing web from a.yaml resolves the conflict: b's pending version is used now.
        a.write_text(service("api", 7000))
        await wait_for(lambda: watcher.errors == {})
        assert names(watcher.current) == ["api", "db", "web"]
        assert ports(watcher.current, "web") == [9999]


async def test_duplicate_in_an_earlier_file_rejects_that_file(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    z = tmp_path / "z.yaml"
    a.write_text(service("api"))
    z.write_text(service("web"))
    async with watch([str(tmp_path)], Recorder()) as watcher:
        a.write_text(service("api") + "---\n" + service("web", 1234))
        await wait_for(lambda: str(a) in watcher.errors)
        assert str(watcher.errors[str(a)]) == (
            f"{a}:11: duplicate Service default/web: already defined at {z}:1"
        )
        assert ports(watcher.current, "web") == [80]
        assert list(watcher.errors) == [str(a)]


async def test_comment_only_change_does_not_notify(tmp_path: Path) -> None:
    web = tmp_path / "web.yaml"
    web.write_text(service("web"))
    changes = Recorder()
    async with watch([str(tmp_path)], changes) as watcher:
        web.write_text(service("web") + "# a trailing comment\n")
        # Wait until the watcher has seen the new version, then check nobody was told.
        stamp = watcher._stamps[str(web)]
        await wait_for(lambda: watcher._stamps[str(web)] != stamp)
        assert changes.configs == []
        assert watcher.reloads == 0


async def test_unchanged_bytes_are_not_parsed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every written file's stamp changes once more when it leaves the racy window (its digest
    # drops out); that, `touch` and a rewrite of the same text must not parse it again.
    monkeypatch.setattr(watcher_module, "_RACY_SECONDS", 0.3)
    parsed: list[str] = []
    real_load_bytes = watcher_module.load_bytes

    def load_bytes(data: bytes, file: str, *args: Any) -> object:
        parsed.append(file)
        return real_load_bytes(data, file, *args)

    monkeypatch.setattr(watcher_module, "load_bytes", load_bytes)
    web, db = tmp_path / "web.yaml", tmp_path / "db.yaml"
    web.write_text(service("web"))
    db.write_text(service("db"))
    changes = Recorder()
    async with watch([str(tmp_path)], changes) as watcher:
        assert sorted(parsed) == sorted([str(web), str(db)])
        parsed.clear()
        racy = watcher._stamps[str(web)]
        assert racy[4]  # written just now: the digest is part of the stamp
        await wait_for(lambda: watcher._stamps[str(web)][4] == "")
        os.utime(db, ns=(time.time_ns(), time.time_ns() + 10**9))
        stamp = watcher._stamps[str(db)]
        await wait_for(lambda: watcher._stamps[str(db)] != stamp)
        stamp = watcher._stamps[str(web)]
        web.write_text(service("web"))
        await wait_for(lambda: watcher._stamps[str(web)] != stamp)
        assert parsed == []
        assert changes.configs == []

        web.write_text(service("web", 81))
        await wait_for(lambda: len(changes.configs) == 1)
        assert parsed == [str(web)]
        assert ports(watcher.current, "web") == [81]
        # Back to bytes seen before is a new version all the same: only the current one's
        # digest counts.
        web.write_text(service("web"))
        await wait_for(lambda: len(changes.configs) == 2)
        assert ports(watcher.current, "web") == [80]
        assert parsed == [str(web), str(web)]


async def test_each_warning_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="control.config")
    web = tmp_path / "web.yaml"
    db = tmp_path / "db.yaml"
    web.write_text(service("web", extra="  sessionAffinity: ClientIP\n"))
    db.write_text(service("db"))
    changes = Recorder()
    async with watch([str(tmp_path)], changes) as watcher:
        for port in (1, 2, 3):
            db.write_text(service("db", port))
            await wait_for(lambda port=port: ports(watcher.current, "db") == [port])  # type: ignore[misc]
        assert len(changes.configs) == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"Service default/web ({web}:1): spec.sessionAffinity ClientIP is not supported; ignored"
    ]


async def test_debounce_coalesces_a_burst_of_writes(tmp_path: Path) -> None:
    web = tmp_path / "web.yaml"
    web.write_text(service("web", 1))
    changes = Recorder()
    async with ConfigWatcher([str(tmp_path)], changes, debounce=0.5, poll_interval=0.02):
        for port in range(2, 12):
            web.write_text(service("web", port))
            await asyncio.sleep(0.02)
        await wait_for(lambda: len(changes.configs) >= 1)
        await asyncio.sleep(0.1)
        assert len(changes.configs) == 1
        assert ports(changes.last, "web") == [11]


async def test_sync_callback_and_failing_callback(tmp_path: Path) -> None:
    web = tmp_path / "web.yaml"
    web.write_text(service("web", 1))
    seen: list[MeshConfig] = []

    def on_change(config: MeshConfig) -> None:
        seen.append(config)
        if len(seen) == 1:
            raise RuntimeError("handler bug")

    async with watch([str(tmp_path)], on_change):
        web.write_text(service("web", 2))
        await wait_for(lambda: len(seen) == 1)
        # The watcher survives a failing handler and keeps delivering.
        web.write_text(service("web", 3))
        await wait_for(lambda: len(seen) == 2)
        assert ports(seen[-1], "web") == [3]


async def test_file_io_runs_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "web.yaml").write_text(service("web"))
    threads: set[int] = set()
    real_scan = watcher_module._scan
    real_load = watcher_module._load_files

    def scan(paths: tuple[str, ...]) -> dict[str, watcher_module.Stamp]:
        threads.add(threading.get_ident())
        return real_scan(paths)

    def load(files: list[str], *args: Any) -> dict[str, object]:
        threads.add(threading.get_ident())
        return real_load(files, *args)  # type: ignore[return-value]

    monkeypatch.setattr(watcher_module, "_scan", scan)
    monkeypatch.setattr(watcher_module, "_load_files", load)
    changes = Recorder()
    async with watch([str(tmp_path)], changes):
        (tmp_path / "web.yaml").write_text(service("web", 81))
        await wait_for(lambda: len(changes.configs) == 1)
    assert threads
    assert threading.get_ident() not in threads


async def test_close_stops_watching(tmp_path: Path) -> None:
    web = tmp_path / "web.yaml"
    web.write_text(service("web", 1))
    changes = Recorder()
    watcher = watch([str(web)], changes)
    await watcher.start()
    await watcher.close()
    web.write_text(service("web", 2))
    await asyncio.sleep(0.15)
    assert changes.configs == []
    assert ports(watcher.current, "web") == [1]
    await watcher.close()  # idempotent


async def test_status_summary(tmp_path: Path) -> None:
    web = tmp_path / "web.yaml"
    web.write_text(service("web"))
    async with watch([str(tmp_path)], Recorder()) as watcher:
        web.write_text("kind: [\n")
        await wait_for(lambda: bool(watcher.errors))
        status = watcher.status()
        assert status["files"] == [str(web)]
        assert status["errors"] == {str(web): str(watcher.errors[str(web)])}
        assert status["failed_loads"] == 1


async def test_an_edited_http_route_alone_is_translated_again(tmp_path: Path) -> None:
    """The watcher keeps one Gateway API Translator: the other route's VirtualService is the
    previous snapshot's object (a translation from nothing would make it anew)."""
    (tmp_path / "base.yaml").write_text(dump(gateway_class(), api_service("v1"), gateway()))
    for n in (1, 2):
        (tmp_path / f"r{n}.yaml").write_text(dump(route(f"r{n}", hostnames=[f"h{n}.test"])))
    changes = Recorder()
    async with watch([str(tmp_path)], changes) as watcher:
        before = {vs.hosts: vs for vs in watcher.current.virtual_services}
        assert set(before) == {("h1.test",), ("h2.test",)}
        (tmp_path / "r1.yaml").write_text(dump(route("r1", hostnames=["h1.test", "h3.test"])))
        await wait_for(lambda: len(changes.configs) == 1)
        after = {vs.hosts: vs for vs in changes.last.virtual_services}
        assert set(after) == {("h1.test",), ("h2.test",), ("h3.test",)}
        assert after[("h2.test",)] is before[("h2.test",)]
        assert after[("h1.test",)] == before[("h1.test",)]  # r1's rules did not change
