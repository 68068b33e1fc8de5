"""Giving freed heap memory back to the operating system after a connection storm (glibc).

Answering thousands of new streams has gRPC copy every response it writes (hundreds of
kilobytes per stream for a large mesh) while each stream's long-lived state is allocated
around those copies; the copies are freed once written, but glibc returns only the top of a
heap to the system, and what they leave between the streams' state stays in the process.
After a storm of 5,000 proxies that was 1-4 KB per stream of RSS holding nothing (issue 9).
`malloc_trim` hands those free pages back; the server calls it once a storm is over
(control/xds/trim.py).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)


def malloc_trim() -> Callable[[], None] | None:
    """glibc's malloc_trim(0), or None where the C library has none (musl, macOS)."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        logger.debug("no malloc_trim in this C library: freed heap memory stays in the process")
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def run() -> None:
        # Blocking (it walks every heap): call it from a thread, not the event loop.
        trim(0)

    return run
