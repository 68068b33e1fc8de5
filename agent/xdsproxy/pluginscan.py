"""Whether any installed package declares an entry point group, told cheaply.

The agent looks for handler plug-ins (agent/xdsproxy/handlers.py) before it serves Envoy, on
its start's critical path. `importlib.metadata` answers that in ~20 ms of CPU on the agent's
machine (the module and the email parser it reads package metadata with, then every
distribution's metadata), and nearly always says "none". This scan reads only the
`entry_points.txt` files next to the import path (~1 ms) and says so; when it cannot be sure
(a zipped or egg path entry, a finder of its own that lists distributions), it says "maybe"
and the caller asks importlib.metadata as before.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from collections.abc import Sequence

# What importlib.metadata reads package metadata from in a directory on the path.
_INFO_SUFFIXES = (".dist-info", ".egg-info")


def may_declare(group: str, path: Sequence[str] | None = None) -> bool:
    """False only when no distribution that importlib.metadata would find on `path`
    (default: sys.path) has `[group]` in its entry_points.txt (blocking: a directory listing
    per path entry and a small read per installed distribution)."""
    for finder in sys.meta_path:
        # Another finder may list distributions of its own that no directory shows.
        if finder is not importlib.machinery.PathFinder and hasattr(finder, "find_distributions"):
            return True
    header = f"[{group}]"
    for entry in sys.path if path is None else path:
        try:
            children = os.scandir(entry or ".")
        except NotADirectoryError:
            return True  # a zip file on the path: its metadata is not read here
        except OSError:
            continue  # importlib.metadata finds nothing there either
        with children:
            for child in children:
                if child.name.endswith(".egg"):
                    return True  # an egg keeps its metadata in EGG-INFO, maybe zipped
                if not child.name.endswith(_INFO_SUFFIXES):
                    continue
                try:
                    with open(os.path.join(child.path, "entry_points.txt"), "rb") as f:
                        text = f.read()
                except OSError:
                    continue  # no entry points (or an .egg-info file, which has none)
                # A superset of importlib.metadata's own section match (a stripped line
                # equal to "[group]"): a false "maybe" only costs the slow path.
                if header.encode() in text:
                    return True
    return False
