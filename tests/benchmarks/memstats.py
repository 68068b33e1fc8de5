"""Run a Python program with a memory probe: on SIGUSR2 it appends one JSON line to a file
with what the process has allocated, as the allocators count it: glibc's bytes in use
(mallinfo2, every arena; Python objects over 512 bytes are in it too) and the bytes in
Python's small-object allocator (pymalloc's allocated blocks). RSS says what the process
holds resident; these say what it allocated, so a benchmark can tell the two apart: memory
freed earlier and reused, or allocated and never touched, moves one and not the other.

It also reports pymalloc's free room: the free blocks of its pools and its empty pools, in
arenas it keeps because a few objects still live in them. That room is resident (it held
objects once) and new objects fill it before pymalloc maps another arena, so a process that
freed a lot before a measurement takes its next objects without its RSS growing.

Usage (the benchmarks start ours and the floor through it; see MemProbe):

    python memstats.py --dump FILE -m control ARGS...
    python memstats.py --dump FILE script.py ARGS...
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import runpy
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
        ).split()
    ]


def _malloc_in_use() -> int:
    try:
        libc = ctypes.CDLL(None)
        info = libc.mallinfo2
    except (OSError, AttributeError):
        return -1  # not glibc
    info.restype = _MallInfo2
    now = info()
    used: int = now.uordblks + now.hblkhd  # heap chunks in use and mmapped ones
    return used


def pymalloc_stats() -> dict[str, int]:
    """pymalloc's bytes in allocated blocks ("python") and its free room ("python_free": free
    blocks in pools in use, and empty pools); -1 where the interpreter does not say.
    sys._debugmallocstats writes to C stderr."""
    saved = os.dup(2)
    with tempfile.TemporaryFile("w+") as out:
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        found: dict[str, int] = {}
        for line in out:
            key, _, value = line.partition("=")
            if line.startswith("# bytes in allocated blocks"):
                found["allocated"] = int(value.replace(",", ""))
            elif line.startswith("# bytes in available blocks"):
                found["available"] = int(value.replace(",", ""))
            elif "unused pools *" in key:
                found["unused"] = int(value.replace(",", ""))
    free = found["available"] + found["unused"] if {"available", "unused"} <= found.keys() else -1
    return {"python": found.get("allocated", -1), "python_free": free}


def _install(dump: str) -> None:
    def probe(_signum: int, _frame: object) -> None:
        sample = {"malloc": _malloc_in_use(), **pymalloc_stats()}
        with open(dump, "a") as f:
            f.write(json.dumps(sample) + "\n")

    signal.signal(signal.SIGUSR2, probe)


class MemProbe:
    """The probe of one process started through this module: `wrap(argv)` gives the command
    line, `sample()` asks the running process for a sample."""

    def __init__(self, directory: Path, name: str) -> None:
        self.path = directory / f"memstats-{name}.jsonl"
        self.pid = 0

    def wrap(self, argv: list[str]) -> list[str]:
        """[python, *rest] -> [python, memstats.py, --dump, FILE, *rest]"""
        return [argv[0], str(Path(__file__)), "--dump", str(self.path), *argv[1:]]

    async def sample(self, timeout: float = 10.0) -> dict[str, int]:
        return await asyncio.to_thread(self._sample, timeout)

    def _sample(self, timeout: float) -> dict[str, int]:
        before = self._lines()
        os.kill(self.pid, signal.SIGUSR2)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self._lines()
            if len(lines) > len(before):
                sample: dict[str, Any] = json.loads(lines[-1])
                return {k: int(v) for k, v in sample.items()}
            time.sleep(0.02)
        raise TimeoutError(f"no memory sample from pid {self.pid}")

    def _lines(self) -> list[str]:
        try:
            return self.path.read_text().splitlines()
        except FileNotFoundError:
            return []


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[1] != "--dump":
        raise SystemExit(__doc__)
    _install(sys.argv[2])
    rest = sys.argv[3:]
    if rest[0] == "-m":
        sys.argv = [rest[1], *rest[2:]]
        runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = rest
        runpy.run_path(rest[0], run_name="__main__")


if __name__ == "__main__":
    main()
