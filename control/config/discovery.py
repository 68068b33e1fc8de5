"""Which files a set of `--config` paths stands for."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable

from control.config.errors import ConfigError

logger = logging.getLogger(__name__)

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


def discover(paths: Iterable[str], *, missing_ok: bool = False) -> list[str]:
    """Config files named by `paths`, sorted by path.

    A file is taken whatever its name; a directory is searched recursively for *.yaml, *.yml
    and *.json. Hidden files and directories (a leading '.') are skipped: editors keep swap
    files there, and Kubernetes ConfigMap volumes keep the real files under `..data/` behind
    visible symlinks, which would otherwise be loaded twice. A file reached twice (by two paths
    or through symlinks) is listed once. A symlink inside a directory that leads outside it
    (to a file or a directory) is not followed: whoever may write the config directory must
    not get the control plane to read other files (a warning says so, once per link). A path
    that does not exist is a ConfigError unless `missing_ok` (the watcher's rescans, where it
    simply has no files yet).
    """
    found: dict[str, str] = {}  # real path -> path as shown to the user
    for path in paths:
        path = os.path.normpath(path)
        if os.path.isdir(path):
            for file, real in _walk(path):
                found.setdefault(real, file)
        elif os.path.exists(path):
            found.setdefault(os.path.realpath(path), path)
        elif not missing_ok:
            raise ConfigError(path, 1, "no such file or directory")
    return sorted(found.values())


# Links already warned about, (link, target): the watcher rescans every poll interval.
_warned: set[tuple[str, str]] = set()
_MAX_WARNED = 10_000


def _inside(real: str, root: str) -> bool:
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _outside_link(path: str, root: str) -> bool:
    """Whether `path` resolves outside `root` (a real path); warns the first time."""
    real = os.path.realpath(path)
    if _inside(real, root):
        return False
    key = (path, real)
    if key not in _warned:
        if len(_warned) >= _MAX_WARNED:
            _warned.clear()
        _warned.add(key)
        logger.warning(
            "config: ignoring %s: it is a symlink to %s, outside the config directory %s",
            path,
            real,
            root,
        )
    return True


def _walk(top: str) -> list[tuple[str, str]]:
    """(file, its real path) for the config files under `top`. The watcher rescans every
    poll interval: a regular file's real path is its directory's joined with its name, so
    only symlinks are resolved (realpath costs a system call per path component)."""
    out: list[tuple[str, str]] = []
    visited: set[str] = set()
    root = os.path.realpath(top)

    def on_error(exc: OSError) -> None:
        logger.debug("cannot list %s: %s", exc.filename, exc.strerror)

    for dirpath, dirnames, filenames in os.walk(top, onerror=on_error, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in visited:  # a symlink loop, or a directory reached twice
            dirnames[:] = []
            continue
        visited.add(real)
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not d.startswith(".") and not _outside_link(os.path.join(dirpath, d), root)
        )
        for name in filenames:
            if name.startswith(".") or not name.lower().endswith(CONFIG_SUFFIXES):
                continue
            file = os.path.join(dirpath, name)
            try:
                mode = os.lstat(file).st_mode
            except OSError:
                continue  # gone since the listing
            if stat.S_ISREG(mode):
                out.append((file, os.path.join(real, name)))
            elif stat.S_ISLNK(mode) and os.path.isfile(file) and not _outside_link(file, root):
                out.append((file, os.path.realpath(file)))
    return out
