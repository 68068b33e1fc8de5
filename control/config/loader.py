"""Loading config files: text -> validated model objects, per file, then merged.

    files = [load_file(p) for p in discover(["conf/"])]   # ConfigError on the first bad file
    mesh = merge(files)                                   # MeshConfig

`load_paths` does both for one-shot use; `ConfigWatcher` (watcher.py) does it continuously.
"""

from __future__ import annotations

import codecs
import logging
from collections.abc import Iterable

from control.config import kinds
from control.config.discovery import discover
from control.config.documents import DocumentCache, Loaded
from control.config.errors import ConfigError
from control.config.manifest import in_revision, objects_of
from control.config.merge import check_duplicates, merge
from control.config.objects import ConfigObject, FileConfig
from control.config.yamlsource import parse_yaml
from control.model.types import ConfigWarning, MeshConfig

# The package (control/config/__init__.py) re-exports the config API; these are this module's.
__all__ = ["DEFAULT_DOMAIN", "load_bytes", "load_file", "load_paths", "load_text", "read_file"]

logger = logging.getLogger(__name__)

DEFAULT_DOMAIN = "cluster.local"


def load_text(
    text: str,
    file: str,
    domain: str = DEFAULT_DOMAIN,
    revision: str = "",
    documents: DocumentCache | None = None,
) -> FileConfig:
    """Parse and validate the objects in `text` (the contents of `file`); objects labelled
    for another revision than `revision` are left out (manifest.in_revision). `documents`:
    what the file's documents loaded to last time, to load only the changed ones again."""

    def load(part: str, first_line: int) -> Loaded:
        objects: list[ConfigObject] = []
        warnings: list[ConfigWarning] = []
        for doc in parse_yaml(part, file, first_line):
            for raw in objects_of(doc):
                if not in_revision(raw, revision):
                    logger.debug("%s: %s is for another revision", file, raw.label)
                    continue
                converted = kinds.convert(raw, domain)
                warnings.extend(converted.warnings)
                if converted.object is not None:
                    objects.append(converted.object)
        return Loaded(tuple(objects), tuple(warnings))

    if documents is None:
        loaded = load(text, 0)
    else:
        loaded = documents.load(text, file, (domain, revision), load)
    check_duplicates(loaded.objects)
    return FileConfig(file, loaded.objects, tuple(dict.fromkeys(loaded.warnings)))


def load_bytes(
    data: bytes,
    file: str,
    domain: str = DEFAULT_DOMAIN,
    revision: str = "",
    documents: DocumentCache | None = None,
) -> FileConfig:
    return load_text(decode(data, file), file, domain, revision, documents)


def load_file(path: str, domain: str = DEFAULT_DOMAIN) -> FileConfig:
    """Load one file; any problem (unreadable, bad YAML, invalid object) is a ConfigError."""
    return load_bytes(read_file(path), path, domain)


def load_paths(paths: Iterable[str], domain: str = DEFAULT_DOMAIN) -> MeshConfig:
    """Load every config file under `paths` (see `discover`); raises on the first bad file."""
    return merge([load_file(path, domain) for path in discover(paths)])


def read_file(path: str) -> bytes:
    """The bytes of a config file; OSError becomes ConfigError (FileNotFoundError included)."""
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except IsADirectoryError:
        raise ConfigError(path, 1, "is a directory, expected a file") from None
    except OSError as exc:
        raise ConfigError(path, 1, f"cannot read file: {exc.strerror or exc}") from None


def decode(data: bytes, file: str) -> str:
    """YAML text is UTF-8 (optionally with a BOM); UTF-16 is accepted with a BOM."""
    try:
        if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
            return data.decode("utf-16")
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        bad = data[exc.start : exc.start + 1].hex()
        raise ConfigError(file, line, f"file is not valid UTF-8 (byte 0x{bad})") from None
