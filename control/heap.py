"""Giving freed heap memory back to the operating system after a connection storm (glibc).

Answering thousands of new streams has gRPC copy every response it writes (hundreds of
kilobytes per stream for a large mesh) while each stream's long-lived state is allocated
around those copies; the copies are freed once written, but glibc returns only the top of a
heap to the system, and what they leave between the streams' state stays in the process.
After a storm of 5,000 proxies that was 1-4 KB per stream of RSS holding nothing (issue 9).
`malloc_trim` hands those free pages back; the server calls it once a storm is over
(control/xds/trim.py). `limit_arenas` keeps the threads' allocations in one shared arena, so
the process holds one high-water mark for them instead of one per thread.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable

logger = logging.getLogger(__name__)


def _libc(name: str, *argtypes: type) -> Callable[..., int] | None:
    """The C library's function `name` taking `argtypes` and returning an int, or None where
    this C library has none (musl, macOS)."""
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        logger.debug("no %s in this C library: the heap is left as it manages it", name)
        return None
    function.argtypes = list(argtypes)
    function.restype = ctypes.c_int
    return function  # type: ignore[no-any-return]


def malloc_trim() -> Callable[[], None] | None:
    """glibc's malloc_trim(0), or None where the C library has none (musl, macOS)."""
    trim = _libc("malloc_trim", ctypes.c_size_t)
    if trim is None:
        return None

    def run() -> None:
        # Blocking (it walks every heap): call it from a thread, not the event loop.
        trim(0)

    return run


# mallopt's parameter number for the arena limit (glibc's malloc.h).
_M_ARENA_MAX = -8
# The control plane's own default: the main thread's arena and one that every other thread
# (gRPC's event engine, the blocking-call executor, the trimmer) shares.
CONTROL_ARENAS = 2


def limit_arenas(arenas: int = CONTROL_ARENAS) -> bool:
    """Caps glibc's malloc arenas at `arenas` for the rest of the process; True if it did.

    glibc gives each thread that allocates an arena of its own (up to eight per core), and
    each keeps the most it ever held: a burst on one of gRPC's event-engine threads leaves
    free memory in that thread's arena that the others cannot use, so the process's RSS is
    the sum of every arena's high-water mark and creeps up for as long as new marks are set
    (the soak, README footnote ⁹: arenas of 1.4-2.2 MB per thread, half of it free, still
    growing ten minutes in). Shared arenas hold one high-water mark between them. Call it
    before threads start allocating: arenas made already stay. A MALLOC_ARENA_MAX in the
    environment is the operator's choice and is left alone."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    mallopt = _libc("mallopt", ctypes.c_int, ctypes.c_int)
    return mallopt is not None and bool(mallopt(_M_ARENA_MAX, arenas))
