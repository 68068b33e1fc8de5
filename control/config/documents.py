"""Reloading a file whose documents mostly did not change.

A controller or an operator moving one endpoint rewrites a file of many documents, and the
watcher reloads the whole file; composing YAML is the costliest step of a reload (libyaml
parses, but the node graph and the tag of every scalar are Python work), a few milliseconds
per fifty documents on every push under churn. `DocumentCache` remembers, per file, what each
document converted to, keyed by the document's text and the line it starts on, so a reload
composes and converts only the documents whose text changed or moved.

A file is cut at its `---` lines only when that cannot change what it means: directives
(`%`), document end markers (`...`), line breaks other than `\\n` and byte order marks send
it down the whole-file path, and so does any document that fails to load on its own (the
whole-file path then reports the error exactly as before). Each document is composed
knowing how many lines of the file precede it, so every line number (in the objects'
sources and warnings) is the one of the whole file.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from control.config.errors import ConfigError
from control.config.objects import ConfigObject
from control.model.types import ConfigWarning

logger = logging.getLogger(__name__)

# A document starts at a line that is `---` alone or followed by a blank (YAML's c-directives-
# end); such a line can occur inside no scalar, so cutting there keeps every document whole.
_DOCUMENT_START = re.compile(r"^---(?=[ \t\n]|$)", re.MULTILINE)
_NOT_CUT = re.compile(r"^%|^\.\.\.(?=[ \t\n]|$)|[\r\x85\u2028\u2029\ufeff]", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Loaded:
    """What one document (or a whole file) converted to."""

    objects: tuple[ConfigObject, ...]
    warnings: tuple[ConfigWarning, ...]


# Loads a text that starts after the given number of lines of its file.
LoadDocuments = Callable[[str, int], Loaded]


def cut(text: str) -> list[tuple[int, str]] | None:
    """The documents of `text` as (0-based line where each starts, its text), or None when
    the text is not to be cut (see the module doc)."""
    if _NOT_CUT.search(text):
        return None
    starts = [m.start() for m in _DOCUMENT_START.finditer(text)]
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    out: list[tuple[int, str]] = []
    line = 0
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(text)
        out.append((line, text[start:end]))
        line += text.count("\n", start, end)
    return out


class DocumentCache:
    """Per file, what each of its current documents loaded to (see the module doc). Not
    thread-safe: one load at a time (the watcher loads in one worker thread at a time)."""

    def __init__(self) -> None:
        # file -> (domain, revision) it was loaded for, and (line, text) -> what it loaded to
        self._files: dict[str, tuple[tuple[str, str], dict[tuple[int, str], Loaded]]] = {}
        self.composed = 0  # documents loaded, not found here (tests count them)

    def load(self, text: str, file: str, scope: tuple[str, str], one: LoadDocuments) -> Loaded:
        """`text`'s objects and warnings, in order: each document from here when its text and
        line are unchanged since the file's last load, else through `one`; the whole text
        through `one` when it is not cut or a document fails alone."""
        documents = cut(text)
        if documents is None or len(documents) < 2:
            self._files.pop(file, None)
            return one(text, 0)
        known_scope, known = self._files.get(file, (scope, {}))
        if known_scope != scope:
            known = {}
        now: dict[tuple[int, str], Loaded] = {}
        objects: list[ConfigObject] = []
        warnings: list[ConfigWarning] = []
        for line, doc in documents:
            key = (line, doc)
            found = known.get(key) or now.get(key)
            if found is None:
                try:
                    found = one(doc, line)
                except ConfigError:
                    # The whole-file path says what is wrong, as it always has.
                    self._files.pop(file, None)
                    return one(text, 0)
                self.composed += 1
            now[key] = found
            objects.extend(found.objects)
            warnings.extend(found.warnings)
        self._files[file] = (scope, now)
        return Loaded(tuple(objects), tuple(warnings))

    def forget(self, file: str) -> None:
        self._files.pop(file, None)

    def __len__(self) -> int:
        return sum(len(docs) for _, docs in self._files.values())
