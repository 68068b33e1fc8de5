"""What the benchmarks read about processes from /proc: CPU time, a child Envoy, memory, and
the machine's load average to print beside each figure."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its waited-for children (the agent, not Envoy)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def envoy_pid(agent_pid: int) -> int:
    """The agent's Envoy: its child process named envoy."""
    for task in Path(f"/proc/{agent_pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if Path(f"/proc/{child}/comm").read_text().startswith("envoy"):
                return int(child)
    raise SystemExit(f"agent {agent_pid} has no Envoy child")


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")
