"""Applying the capture rules with Debian's iptables (`iptables-save` / `iptables-restore`,
nft or legacy backend, whichever `iptables` is). The rules themselves come from
`agent.capture.rules`; this module only runs the tools, reads what is installed and turns
failures into one clear message.

Every change is one `iptables-restore --noflush` transaction, so a failure leaves the table as
it was, and nothing outside our own chains (and the jumps into them) is touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from agent.capture.rules import TABLE, CaptureSettings, apply_script, cleanup_script, parse_save

CAP_NET_ADMIN = 12
_SBIN = ("/usr/sbin", "/sbin")


class CaptureError(RuntimeError):
    """Capture could not be set up or removed; the message says why, in one line."""


def has_net_admin(status_path: str = "/proc/self/status") -> bool:
    """Whether this process holds CAP_NET_ADMIN (root normally does; a container may not)."""
    try:
        for line in Path(status_path).read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_NET_ADMIN & 1)
    except (OSError, ValueError):
        pass
    return os.geteuid() == 0


def find_tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=os.pathsep.join(_SBIN))
    if found is None:
        raise CaptureError(f"{name} not found: install Debian's iptables package")
    return found


def has_ipv6_address(path: str = "/proc/net/if_inet6") -> bool:
    """Whether this network namespace has an IPv6 address of global scope (ULA included): a
    dual-stack pod, whose IPv6 traffic needs the ip6tables half of the capture. Loopback and
    link-local addresses alone do not count (every namespace with IPv6 enabled has those)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return False  # IPv6 disabled in this kernel
    return any(len(f) >= 6 and f[3] == "00" for f in (line.split() for line in lines))


class Iptables:
    """The nat table of the current network namespace, IPv4 (iptables) or IPv6 (ip6tables)."""

    def __init__(self, save: str = "", restore: str = "", family: int = 4) -> None:
        self.family = family
        tool = "iptables" if family == 4 else "ip6tables"
        self._save = save or ""
        self._restore = restore or ""
        self._tools = (f"{tool}-save", f"{tool}-restore")

    def _require(self) -> tuple[str, str]:
        if not has_net_admin():
            raise CaptureError(
                "changing iptables needs root or CAP_NET_ADMIN (run as an init container with "
                "NET_ADMIN, or use --dry-run to only print the rules)"
            )
        save = self._save or find_tool(self._tools[0])
        restore = self._restore or find_tool(self._tools[1])
        return save, restore

    def save(self) -> str:
        save, _ = self._require()
        return _run([save, "-t", TABLE])

    def restore(self, script: str) -> None:
        _, restore = self._require()
        _run([restore, "--noflush"], script)

    def apply(self, settings: CaptureSettings) -> None:
        """Install the rules, replacing an earlier install of ours (idempotent)."""
        self.restore(apply_script(settings, parse_save(self.save()), self.family))

    def cleanup(self) -> bool:
        """Remove exactly what apply added; False when nothing of ours was installed."""
        script = cleanup_script(parse_save(self.save()))
        if script is None:
            return False
        self.restore(script)
        return True


def _run(cmd: list[str], stdin: str | None = None) -> str:
    try:
        done = subprocess.run(
            cmd, input=stdin, capture_output=True, text=True, timeout=30, check=False
        )
    except OSError as e:
        raise CaptureError(f"cannot run {cmd[0]}: {e}") from None
    except subprocess.TimeoutExpired:
        raise CaptureError(f"{cmd[0]} did not finish in 30s") from None
    if done.returncode != 0:
        detail = " ".join((done.stderr or done.stdout).split()) or f"exit code {done.returncode}"
        raise CaptureError(f"{Path(cmd[0]).name} failed: {detail}")
    return done.stdout
