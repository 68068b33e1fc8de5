"""What the xDS scale benchmarks share: the control plane and the floor server as processes of
their own (so their memory, CPU and file descriptors can be read from /proc alone), metrics,
and a line about the machine.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families

from tests.support.cpproc import ControlPlaneProcess

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


class ProcStats:
    """Memory, CPU time and open files of one process, from /proc."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def _status(self, key: str) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"no {key} for pid {self.pid}")

    def rss(self) -> int:
        return self._status("VmRSS")

    def peak_rss(self) -> int:
        return self._status("VmHWM")

    def cpu(self) -> float:
        """User + system CPU seconds."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / _TICK

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def threads(self) -> int:
        # Each thread that allocates may get a glibc arena of its own: a thread started late
        # shows in RSS as a step.
        return self._status("Threads") // 1024


def machine() -> str:
    load = os.getloadavg()
    return (
        f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
        f"{dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}"
    )


class ControlPlaneRun:
    """`python -m control` on fresh loopback ports, serving `mesh`, with the flags given
    (defaults otherwise: 100 ms debounce, admission 200 streams/s after a burst of 400)."""

    def __init__(self, mesh: Path, *flags: str) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="pf-xds-bench-"))
        self.proc = ControlPlaneProcess(
            "bench-cp",
            self.tmp,
            "--config",
            str(mesh),
            "--state-dir",
            str(self.tmp / "state"),
            "--log-level",
            "warning",
            # ControlPlaneProcess passes test settings; back to the defaults.
            "--debounce-after",
            "0.1",
            "--debounce-max",
            "10",
            *flags,
        )
        self.stats: ProcStats | None = None

    @property
    def target(self) -> str:
        return self.proc.xds

    async def start(self, timeout: float = 120.0) -> None:
        self.proc.start()
        assert self.proc.proc is not None
        self.stats = ProcStats(self.proc.proc.pid)
        deadline = time.monotonic() + timeout
        while not await asyncio.to_thread(self.proc.is_ready):
            if self.proc.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"control plane did not start:\n{self.proc.log()[-3000:]}")
            await asyncio.sleep(0.2)

    def _get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"http://{self.proc.http}{path}", timeout=30) as r:
            return bytes(r.read())

    async def metrics(self) -> dict[str, float]:
        """Every sample, keyed `name{label="value",…}` (labels sorted), or `name`."""
        text = (await asyncio.to_thread(self._get, "/metrics")).decode()
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out

    async def pushz(self) -> list[dict[str, Any]]:
        data = json.loads(await asyncio.to_thread(self._get, "/debug/pushz"))
        return list(data["recent"])

    async def close(self) -> None:
        if self.proc.proc is not None and self.proc.proc.poll() is None:
            self.proc.proc.terminate()
            try:
                await asyncio.to_thread(self.proc.proc.wait, 30)
            except Exception:
                self.proc.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)  # state and log (log_tail() before)

    def log_tail(self) -> str:
        return self.proc.log()[-3000:]


class FloorRun:
    """xds_floor.py in its own process."""

    def __init__(self, mesh: Path, services: int) -> None:
        self.args = [
            sys.executable,
            str(Path(__file__).with_name("xds_floor.py")),
            "--mesh",
            str(mesh),
            "--services",
            str(services),
        ]
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0
        self.stats: ProcStats | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        ready = await self._line()
        self.port = int(ready["port"])
        self.stats = ProcStats(self.proc.pid)

    async def _line(self) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 120)
        if not line:
            raise RuntimeError("the floor server exited")
        return dict(json.loads(line))

    async def command(self, cmd: str) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(cmd.encode() + b"\n")
        await self.proc.stdin.drain()
        return await self._line()

    async def close(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"stop\n")
        await self.proc.stdin.drain()
        self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 20)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


def least_squares_slope(xs: list[float], ys: list[float]) -> float:
    """Slope of the least-squares line through (xs, ys)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def metric(m: dict[str, float], name: str) -> float:
    """A sample's value, 0 when absent; `name` may end in `*` to sum every label set."""
    if name.endswith("*"):
        prefix = name[:-1]
        return sum(v for k, v in m.items() if k == prefix or k.startswith(prefix + "{"))
    return m.get(name, 0.0)
