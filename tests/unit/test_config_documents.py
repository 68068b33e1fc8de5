"""DocumentCache (control/config/documents.py): a reload composes only the documents that
changed, and loads exactly what the whole file loads (objects, their lines, warnings,
errors)."""

from __future__ import annotations

import pytest

from control.config.documents import DocumentCache, cut
from control.config.errors import ConfigError
from control.config.loader import load_text


def entries(n: int, moved: int | None = None) -> str:
    docs = []
    for s in range(n):
        address = "10.9.9.9" if s == moved else f"10.0.0.{s + 1}"
        docs.append(
            "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\n"
            f"metadata: {{name: we-{s}, namespace: default}}\n"
            f'spec: {{address: "{address}", labels: {{app: a{s}}}}}\n'
        )
    return "---\n".join(docs)


def test_a_reload_composes_only_the_changed_document() -> None:
    cache = DocumentCache()
    first = load_text(entries(50), "f.yaml", documents=cache)
    assert first == load_text(entries(50), "f.yaml")
    assert cache.composed == 50 and len(cache) == 50
    again = load_text(entries(50, moved=20), "f.yaml", documents=cache)
    assert cache.composed == 51  # the moved entry alone
    assert again == load_text(entries(50, moved=20), "f.yaml")
    assert len(cache) == 50  # the old version of the moved document is forgotten
    # Another domain or revision loads everything again.
    load_text(entries(50, moved=20), "f.yaml", domain="example.org", documents=cache)
    assert cache.composed == 101


def test_lines_are_those_of_the_whole_file() -> None:
    text = entries(3) + "---\n# a comment\n\n" + entries(2).replace("we-", "other-")
    cache = DocumentCache()
    loaded = load_text(text, "f.yaml", documents=cache)
    assert loaded == load_text(text, "f.yaml")
    assert [o.source.line for o in loaded.objects] == [1, 6, 11, 18, 23]
    # A document that moves down a line is loaded again (its lines changed).
    moved = load_text("\n" + text, "f.yaml", documents=cache)
    assert [o.source.line for o in moved.objects] == [2, 7, 12, 19, 24]


def test_errors_are_reported_as_for_the_whole_file() -> None:
    bad = entries(5).replace('address: "10.0.0.3"', 'address: "not an address"')
    bad_yaml = entries(5) + "---\nkind: [unclosed\n---\n" + entries(1).replace("we-", "x-")
    for text in (bad, bad_yaml):
        with pytest.raises(ConfigError) as whole:
            load_text(text, "f.yaml")
        with pytest.raises(ConfigError) as cached:
            load_text(text, "f.yaml", documents=DocumentCache())
        assert str(cached.value) == str(whole.value)
    # A duplicate across two documents: found over the file, as before.
    dup = entries(3) + "---\n" + entries(1)
    with pytest.raises(ConfigError, match="we-0"):
        load_text(dup, "f.yaml", documents=DocumentCache())


@pytest.mark.parametrize(
    "text",
    [
        "%YAML 1.2\n---\na: 1\n---\nb: 2\n",  # a directive
        "a: 1\n...\n---\nb: 2\n",  # a document end marker
        "a: 1\r\n---\r\nb: 2\r\n",  # other line breaks
    ],
)
def test_texts_that_could_mean_otherwise_are_not_cut(text: str) -> None:
    assert cut(text) is None


def test_cut_keeps_every_document_whole() -> None:
    text = "a: |\n  ---x\n  text\n---\nb: 1\n--- # comment\nc: 2\n---x: 3\n"
    assert cut(text) == [
        (0, "a: |\n  ---x\n  text\n"),
        (3, "---\nb: 1\n"),
        (5, "--- # comment\nc: 2\n---x: 3\n"),
    ]
