"""The cheap plug-in scan (agent/xdsproxy/pluginscan.py): it may say "maybe" too often, never
"no" when importlib.metadata would find a plug-in, and with no plug-in installed the agent's
start does not load importlib.metadata (counted in modules, not timed)."""

from __future__ import annotations

import zipfile
from importlib import metadata
from pathlib import Path

from agent.xdsproxy.pluginscan import may_declare
from tests.support.fresh import fresh_lines

GROUP = "pf.test.scan"


def _dist(root: Path, name: str, entry_points: str | None, suffix: str = ".dist-info") -> None:
    info = root / f"{name}-0.1{suffix}"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    if entry_points is not None:
        (info / "entry_points.txt").write_text(entry_points)


def _metadata_finds(path: list[str]) -> bool:
    return any(
        ep.group == GROUP for dist in metadata.distributions(path=path) for ep in dist.entry_points
    )


def test_no_for_distributions_without_the_group(tmp_path: Path) -> None:
    _dist(tmp_path, "none", None)
    _dist(tmp_path, "other", "[console_scripts]\nx = m:main\n")
    _dist(tmp_path, "legacy", "[other.group]\ny = m:setup\n", ".egg-info")
    (tmp_path / "plain.egg-info").write_text("Metadata-Version: 1.0\n")  # a file, no entry points
    path = [str(tmp_path), str(tmp_path / "missing")]
    assert not may_declare(GROUP, path)
    assert not _metadata_finds(path)


def test_yes_where_importlib_metadata_finds_the_group(tmp_path: Path) -> None:
    for suffix in (".dist-info", ".egg-info"):
        root = tmp_path / suffix.strip(".")
        _dist(root, "plug", f"[other]\na = m:x\n\n  [{GROUP}]  \nb = m:setup\n", suffix)
        path = [str(tmp_path / "empty"), str(root)]
        assert _metadata_finds(path)
        assert may_declare(GROUP, path)


def test_maybe_for_what_it_does_not_read(tmp_path: Path) -> None:
    """A zip or an egg on the path: the caller asks importlib.metadata."""
    archive = tmp_path / "plugins.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("plug-0.1.dist-info/entry_points.txt", f"[{GROUP}]\nb = m:setup\n")
    assert may_declare(GROUP, [str(archive)])
    (tmp_path / "eggs" / "plug-0.1.egg").mkdir(parents=True)
    assert may_declare(GROUP, [str(tmp_path / "eggs")])


def test_agent_start_without_plug_ins_skips_importlib_metadata() -> None:
    code = (
        "import sys\n"
        "from agent.xdsproxy.handlers import HandlerRegistry\n"
        "print(HandlerRegistry().load_entry_points())\n"
        "print('importlib.metadata' in sys.modules)\n"
    )
    assert fresh_lines(code)[:2] == ["[]", "False"]
