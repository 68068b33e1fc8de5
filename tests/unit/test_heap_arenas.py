"""glibc's arena limit (control/heap.py limit_arenas): threads that allocate at once share the
capped arenas instead of each holding one of its own, and the heap memory the process holds
after their bursts is measured (malloc_info, in a fresh interpreter: the limit is for the
whole process and only binds arenas made after it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Eight threads allocate 2 MB each in 64 KB blocks at the same time (below glibc's mmap
# threshold, so from their arenas), keep one block in eight and free the rest, as gRPC's
# threads do with the buffers of a burst of writes among longer-lived state.
_PROGRAM = """
import ctypes, re, sys, tempfile, threading
from control.heap import limit_arenas
applied = limit_arenas(int(sys.argv[1])) if sys.argv[1] != "0" else False
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.fclose.argtypes = [ctypes.c_void_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
start, done = threading.Barrier(8), threading.Barrier(9)
kept = []
def burst():
    start.wait()
    blocks = [libc.malloc(64 << 10) for _ in range(32)]
    for i, b in enumerate(blocks):
        if i % 8:
            libc.free(b)
        else:
            kept.append(b)
    done.wait()
threads = [threading.Thread(target=burst) for _ in range(8)]
for t in threads:
    t.start()
done.wait()
with tempfile.NamedTemporaryFile(suffix=".xml") as f:
    fp = libc.fopen(f.name.encode(), b"w")
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    xml = open(f.name).read()
heaps = re.findall(r'<heap nr="\\d+">.*?<system type="current" size="(\\d+)"/>', xml, re.S)
print(applied, len(heaps), sum(int(h) for h in heaps))
for t in threads:
    t.join()
"""


def _run(arenas: int) -> tuple[bool, int, int]:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run(
        [sys.executable, "-c", _PROGRAM, str(arenas)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    return out[0] == "True", int(out[1]), int(out[2])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc arenas")
def test_capped_arenas_hold_one_high_water_mark_between_threads() -> None:
    applied, heaps, held = _run(2)
    _, free_heaps, free_held = _run(0)
    assert applied
    assert heaps <= 2, heaps
    # Not vacuous: left alone, glibc gives the threads arenas of their own.
    assert free_heaps > 2, free_heaps
    # Each uncapped arena keeps the top of its own burst; the capped ones reuse each other's
    # freed blocks (8 threads x 2 MB: about 16 MB of heaps uncapped here).
    assert held < free_held, (held, free_held)


def test_an_operators_setting_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from control.heap import limit_arenas

    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_arenas() is False
