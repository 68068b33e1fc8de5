"""Envoy exec'd from a fork of the agent before the agent has an event loop, threads or gRPC.

`python -m agent` starts Envoy as soon as its config is parsed and Envoy's bootstrap is
written (agent/envoystart.py), ~35 ms before it could through a launcher interpreter: Envoy's
own start (~50 ms to its first xDS request) then runs on the other core while the agent
imports gRPC and binds the sockets Envoy will dial. Envoy may dial its xDS socket before the
agent has bound it; the bootstrap's retry policy for that stream makes it try again within
tens of milliseconds (agent/envoy/bootstrap.py).

A fork is safe only in a process with one thread and no gRPC (gRPC's threads and locks are
not the child's to use); `fork_exec` refuses otherwise, and the agent falls back to the
launcher of agent/envoy/process.py. The child does only what the launcher does, then execs:
its own session, stdin from /dev/null, stderr into a pipe the agent reads, the user of
`run_as` when given, the parent-death signal, and the default dispositions of the signals
Python ignores. It never returns into the agent's code.

Stdlib only, and no asyncio: `EnvoySupervisor.spawn` adopts the child in the event loop.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

_PR_SET_PDEATHSIG = 1
# What an exec that failed exits with, as a shell does for a command it cannot run.
EXEC_FAILED = 127


@dataclass(frozen=True, slots=True, eq=False)  # no __eq__: compiled on the start path
class ForkedProcess:
    """A child started by `fork_exec`: its pid and the read end of its stderr pipe, which the
    adopter owns from then on."""

    pid: int
    stderr: int
    command: tuple[str, ...]


def fork_is_safe() -> bool:
    """Whether this process may fork and run Python in the child: one thread, no gRPC."""
    return threading.active_count() == 1 and "grpc" not in sys.modules


def fork_exec(
    command: Sequence[str], run_as: tuple[int, int] | None = None
) -> ForkedProcess | None:
    """`command` started in a forked child (see the module docstring); None where forking is
    unsafe (another thread runs, or gRPC is imported) or fails. A command that cannot be
    exec'd shows as the child's exit with `EXEC_FAILED` and a line on its stderr."""
    if not fork_is_safe():
        return None
    argv = tuple(command)
    read, write = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read)
        os.close(write)
        return None
    if pid == 0:  # pragma: no cover - the child; tests see it through the exec'd process
        _child(argv, write, run_as, parent=os.getppid())
    os.close(write)
    return ForkedProcess(pid, read, argv)


def _child(
    argv: tuple[str, ...], stderr: int, run_as: tuple[int, int] | None, parent: int
) -> NoReturn:
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(stderr, 2)
        linux = sys.platform.startswith("linux")
        if linux:
            # Loaded before the user changes: the new one may not read this interpreter's
            # files (a Python under /root, say).
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
        if run_as is not None:
            # Before the parent-death signal: a change of credentials clears it.
            os.setgroups([])
            os.setgid(run_as[1])
            os.setuid(run_as[0])
        if linux:
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0):
                _fail("cannot set the parent-death signal: " + os.strerror(ctypes.get_errno()))
            if os.getppid() != parent:
                _fail("the agent exited before Envoy started")
        # Python ignores these; an exec'd program would inherit that (subprocess restores them).
        for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ"):
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_DFL)
        os.execvp(argv[0], argv)
    except BaseException as e:  # nothing may return into the agent's code
        _fail(f"cannot start {argv[0]!r}: {e}")
    _fail("exec returned")


def _fail(message: str) -> NoReturn:
    try:
        os.write(2, f"{message}\n".encode(errors="replace"))
    finally:
        os._exit(EXEC_FAILED)
