"""The key worker's process (agent/sds/keyworker.py): forked as the first thing `python -m agent`
does, for the first certificate; spawned as a new interpreter for each later one (the agent
has threads by then, which a fork would not copy).

Stdlib only, and only what the fork needs: after it, this process copies every page it writes
that the fork left shared, so the less this process holds by then, the less it copies. Forked
after `import asyncio` and the agent's config (~12 MB written), the copying cost the agent
~10 ms before its channel was up; forked here, it holds ~5 MB.

The child loads cryptography at once (the point of the worker), then answers requests on its
end of a socket pair (agent/sds/keywire.py) until its one check is answered, the agent's end
closes, or it idles for `IDLE_SECONDS`; it never returns into the agent's code.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from typing import NoReturn

IDLE_SECONDS = 60.0


def fork_key_worker() -> tuple[int, socket.socket] | None:
    """(the worker's pid, this end of its socket pair), or None where forking is unsafe
    (another thread runs, or gRPC is imported: their state is not the child's to share) or
    fails."""
    if threading.active_count() > 1 or "grpc" in sys.modules:
        return None
    parent, child = socket.socketpair()
    try:
        pid = os.fork()
    except OSError:
        parent.close()
        child.close()
        return None
    if pid == 0:  # pragma: no cover - the child; tests see it through its answers
        parent.close()
        run_worker(child)
    child.close()
    return pid, parent


# What a spawned worker runs: the agent's package from where this process has it.
_FD = 3
_SPAWNED = (
    f"import socket; from agent.sds.workerproc import run_worker; "
    f"run_worker(socket.socket(fileno={_FD}))"
)


def spawn_key_worker() -> tuple[int, socket.socket] | None:
    """A worker in a new interpreter, for a process that has threads by now (its later
    certificates): (pid, this end of its socket pair), or None where it cannot be started
    (blocking: ~1 ms; its ~80 ms of start-up run in the child)."""
    if not sys.executable:
        return None
    parent, child = socket.socketpair()
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONPATH=package_root + (os.pathsep + path if path else ""))
    try:
        pid = os.posix_spawn(
            sys.executable,
            [sys.executable, "-c", _SPAWNED],
            env,
            file_actions=[(os.POSIX_SPAWN_DUP2, child.fileno(), _FD)],
        )
    except OSError:
        parent.close()
        return None
    finally:
        child.close()
    return pid, parent


def run_worker(sock: socket.socket) -> NoReturn:  # pragma: no cover - runs in the worker
    """The worker's life, then its exit: 0 once it is done, 1 if it failed (the agent's end
    closed mid-answer, say). Never a traceback: the agent sees a failure as a missing answer
    and works in its own process instead. os._exit: no atexit handlers and no flushing of
    buffers that, in a forked worker, are the agent's."""
    code = 1
    try:
        _serve(sock)
        code = 0
    except BaseException:
        pass
    finally:
        os._exit(code)


def _serve(sock: socket.socket) -> None:  # pragma: no cover - runs in the worker
    """Answer requests until the one check is answered, the agent's end closes, or the worker
    idles too long (blocking)."""
    from agent.sds import certcheck, keys  # noqa: F401  (loaded before the first request)
    from agent.sds.keywire import Frames, answer, encode

    sock.settimeout(IDLE_SECONDS)
    frames = Frames()
    while True:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            return
        if not data:
            return
        for request in frames.feed(data):
            sock.sendall(encode(answer(request)))
            if request.get("op") == "check":
                return
