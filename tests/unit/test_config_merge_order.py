"""The merge takes each file's objects as that file worked out when it was loaded
(FileConfig.parts) and puts the files end to end; the result must be what one global sort of
all objects by (file, line) gives, which is how the merge used to work. Checked (hypothesis)
over random sets of real manifests in random files and orders, with duplicates across files
and files whose objects name another file (the path that sorts everything again)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control.config.errors import DuplicateObjectError
from control.config.loader import load_text
from control.config.merge import merge
from control.config.objects import FileConfig
from control.model.types import MeshConfig
from tests.support.configfuzz import CORPUS
from tests.support.fuzz import fuzz_settings

NAMES = sorted(CORPUS)
# Loading is the slow part of an example; each (corpus, path) is loaded once.
_LOADED: dict[tuple[str, str], FileConfig] = {}


def loaded(name: str, path: str) -> FileConfig:
    key = (name, path)
    if key not in _LOADED:
        _LOADED[key] = load_text(CORPUS[name], path)
    return _LOADED[key]


@dataclass(frozen=True)
class Outcome:
    config: MeshConfig | None
    error: tuple[str, int, str] | None


def outcome(files: list[FileConfig]) -> Outcome:
    try:
        return Outcome(merge(files), None)
    except DuplicateObjectError as e:
        return Outcome(None, (e.file, e.line, str(e)))


def reference(files: list[FileConfig]) -> Outcome:
    """All objects in one FileConfig: sorted once, globally, by (file, line)."""
    warnings = tuple(w for f in sorted(files, key=lambda f: f.path) for w in f.warnings)
    return outcome([FileConfig("", tuple(o for f in files for o in f.objects), warnings)])


files_strategy = st.lists(
    st.tuples(
        st.sampled_from(NAMES),
        st.sampled_from(["a.yaml", "b/c.yaml", "m.yaml", "z.yaml", "0.yaml", "k/k.yaml"]),
        # True: the file's objects say they came from another file.
        st.booleans(),
    ),
    max_size=6,
    unique_by=lambda t: t[1],
)


@fuzz_settings(60)
@given(files_strategy, st.randoms(use_true_random=False))
def test_files_end_to_end_merge_as_one_global_sort(
    picks: list[tuple[str, str, bool]], rnd: random.Random
) -> None:
    files = []
    for name, path, foreign in picks:
        f = loaded(name, path)
        if foreign:
            f = FileConfig(f"elsewhere/{path}", f.objects, f.warnings)
        files.append(f)
    rnd.shuffle(files)  # the merge must not depend on the order it is handed files in
    got, want = outcome(files), reference(files)
    assert got.error == want.error
    if want.config is None:
        return
    assert got.config is not None
    assert got.config == want.config
    # Not part of MeshConfig's equality, and shown by /debug/configz and the warning log.
    assert got.config.raw == want.config.raw
    assert got.config.warnings == want.config.warnings


def test_a_duplicate_across_files_points_at_the_later_one() -> None:
    first, second = loaded("service", "a.yaml"), loaded("service", "b/c.yaml")
    with pytest.raises(DuplicateObjectError) as e:
        merge([second, first])
    assert e.value.file == "b/c.yaml"
    assert e.value.first_file == "a.yaml"


def test_parts_are_worked_out_once_per_file_version() -> None:
    f = loaded("demo", "demo.yaml")
    assert f.parts.file == "demo.yaml"
    assert len(f.parts.objects) == len(f.objects) > 0
    assert [o.source.line for o in f.parts.objects] == sorted(o.source.line for o in f.objects)
    foreign = FileConfig("other.yaml", f.objects)
    assert foreign.parts.file == ""
