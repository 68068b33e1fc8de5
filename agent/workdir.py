"""The agent's workdir, made private enough for the sockets it will hold (stdlib only: made
before Envoy is started, agent/envoystart.py, and before gRPC is imported)."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["WORKDIR_MODE", "make_workdir"]

WORKDIR_MODE = 0o755


def make_workdir(path: Path) -> None:
    """Create the workdir and any missing parents 0755 whatever the umask (blocking, a few
    syscalls; call once at startup). Under umask 000 a plain mkdir makes them 0777, and a user
    who can write the workdir (or a parent) can put their own socket in place of XDS or SDS.
    An existing directory is left as it is (it may be a volume, or shared), but one that other
    users may write is reported."""
    path = path.absolute()
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, WORKDIR_MODE)  # umask can only remove bits from 0755
    mode = os.stat(path).st_mode
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        logger.warning(
            "workdir %s is writable by other users (mode %o): they could replace its sockets",
            path,
            stat.S_IMODE(mode),
        )
