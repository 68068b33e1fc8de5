"""Message classes by type URL, importing only the generated module that defines the type.

xds-protos (and the protobuf runtime's own well-known types) lay generated modules out by
proto file, one directory per proto package: `envoy.config.core.v3.TypedExtensionConfig` is
defined in one of the `*_pb2.py` files of `envoy/config/core/v3/`. Which one is not derivable
from the name (it is `extension_pb2`), and importing every module of the package, or all of
Envoy's ~640, would cost start-up time and memory for types nobody asked for. So the lookup
reads the sources of that one directory and imports the module whose generated code defines
the message (`_globals['_TYPEDEXTENSIONCONFIG']`, protobuf's generated-code marker for a
message descriptor); when no file carries the marker (another generator's style) it falls
back to importing the directory's modules one by one until the type appears.

Our own protos (protos/*.proto) are not laid out by package; they are few and small, and are
imported on the first lookup that misses.

Lookups are cached (hits and misses) and run only for names a caller chose (a handler's
registration), never for type URLs read off the wire.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
from pathlib import Path

from google.protobuf import message_factory, symbol_database
from google.protobuf.message import Message

logger = logging.getLogger(__name__)

_PREFIX = "type.googleapis.com/"
_OWN_MODULES = ("protos.nds_pb2", "protos.probe_pb2", "protos.peers_pb2", "protos.ca_pb2")

_lock = threading.Lock()
_cache: dict[str, type[Message] | None] = {}
_own_imported = False


class UnknownMessageType(LookupError):
    """No installed generated module defines the type."""

    def __init__(self, type_url: str, reason: str) -> None:
        super().__init__(f"unknown message type {type_url!r}: {reason}")
        self.type_url = type_url


def full_name(type_url: str) -> str:
    """The message's full name: what follows the last `/` of a type URL (any host, as the
    Any spec allows), or the name itself."""
    return type_url.rpartition("/")[2]


def message_class(type_url: str) -> type[Message]:
    """The generated class of `type_url` (or a bare full name); raises UnknownMessageType."""
    name = full_name(type_url)
    if not name or not all(part.isidentifier() for part in name.split(".")):
        raise UnknownMessageType(type_url, "not a protobuf message name")
    with _lock:
        if name not in _cache:
            _cache[name] = _lookup(name)
        cls = _cache[name]
    if cls is None:
        raise UnknownMessageType(
            type_url, "no installed generated module (xds-protos, protobuf, protos/) defines it"
        )
    return cls


def _from_pool(name: str) -> type[Message] | None:
    try:
        descriptor = symbol_database.Default().pool.FindMessageTypeByName(name)
    except KeyError:
        return None
    cls: type[Message] = message_factory.GetMessageClass(descriptor)
    return cls


def _lookup(name: str) -> type[Message] | None:
    global _own_imported
    cls = _from_pool(name)
    if cls is not None:
        return cls
    parts = name.split(".")
    # `pkg.Outer.Inner`: the package is some prefix of the name; the longest one that is an
    # installed package directory wins (proto packages are lower case, messages not, but
    # nothing enforces it).
    for cut in range(len(parts) - 1, 0, -1):
        cls = _import_defining_module(".".join(parts[:cut]), parts[cut:], name)
        if cls is not None:
            return cls
    if not _own_imported:
        _own_imported = True
        for module in _OWN_MODULES:
            importlib.import_module(module)
        return _from_pool(name)
    return None


def _package_dirs(package: str) -> list[Path]:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def _import_defining_module(package: str, nested: list[str], name: str) -> type[Message] | None:
    dirs = _package_dirs(package)
    if not dirs:
        return None
    sources = sorted(p for d in dirs for p in d.glob("*_pb2.py"))
    marker = f"_globals['_{'_'.join(nested).upper()}']"
    marked: list[Path] = []
    unmarked: list[Path] = []
    for path in sources:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        (marked if marker in text else unmarked).append(path)
    for path in [*marked, *unmarked]:
        module = f"{package}.{path.stem}"
        try:
            importlib.import_module(module)
        except Exception as e:  # a broken generated module must not hide the others
            logger.debug("cannot import %s: %r", module, e)
            continue
        cls = _from_pool(name)
        if cls is not None:
            logger.debug("%s is defined in %s", name, module)
            return cls
    return None
