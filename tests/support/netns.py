"""Pods as Linux network namespaces, for tests of transparent capture (interception mode
REDIRECT), where a pod must own its network stack: its iptables rules, its 15001/15006.

A `PodNetwork` is a /24 from 198.18.0.0/15 (the benchmarking range, never routed) with a
bridge in a namespace of its own (the "switch"), a veth from the root namespace to it (the
gateway address `.1`, where the control plane and test servers listen) and one namespace per
pod, each with a veth to the bridge, loopback up, a default route via the gateway and an
`/etc/netns/<ns>/resolv.conf` naming the gateway as resolver (which `ip netns exec` puts in
place of /etc/resolv.conf for processes run in the pod).

With `ipv6=True` the network is dual-stack: a /64 from the ULA range (fd70:6966::/32 here,
never routed) on the same links, the gateway `::1` of it, each pod an IPv6 address next to its
IPv4 one (`Pod.ip6`), added without duplicate-address detection so they are usable at once.

Everything is removed on close, also when the test fails: processes started in the pods are
killed (`ip netns pids`), namespaces, links and resolv.conf directories deleted.

Needs root (CAP_SYS_ADMIN + CAP_NET_ADMIN) and `ip`/`iptables` (`make sysdeps`);
`require_netns()` skips the test with a clear message where namespaces are not permitted.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_seq = itertools.count(1)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def require_netns() -> None:
    """Skip (with the reason) unless this process may create network namespaces."""
    if shutil.which("ip") is None:
        pytest.skip("network-namespace pods need `ip` (iproute2): run `make sysdeps`")
    if shutil.which("iptables") is None and not Path("/usr/sbin/iptables").exists():
        pytest.skip("network-namespace pods need iptables: run `make sysdeps`")
    if os.geteuid() != 0:
        pytest.skip("network-namespace pods need root (ip netns, iptables)")
    probe = f"pfprobe{os.getpid()}"
    done = _ip("netns", "add", probe, check=False)
    if done.returncode != 0:
        pytest.skip(f"network namespaces are not permitted here: {done.stderr.strip()}")
    _ip("netns", "del", probe, check=False)


@dataclass
class Pod:
    """One network namespace with an address on the pod network."""

    name: str
    netns: str
    ip: str
    gateway: str
    ip6: str = ""  # dual-stack networks only
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def command(self, *argv: str) -> list[str]:
        """`argv` run inside the pod (its network and its resolv.conf)."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def python(self, *argv: str) -> list[str]:
        return self.command(sys.executable, *argv)

    def run(
        self, *argv: str, timeout: float = 30, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(*argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            cwd=ROOT,
            env=clean_env(),
        )

    def spawn(self, argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
        """A long-running process in the pod (an app), output to `log`; killed on close."""
        with log.open("wb") as out:
            proc = subprocess.Popen(
                self.command(*argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env=clean_env(),
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc


def clean_env() -> dict[str, str]:
    """The environment for processes in pods: no proxy settings (the point is that apps
    know nothing of the mesh), unbuffered Python."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
    }
    env["PYTHONUNBUFFERED"] = "1"
    return env


class PodNetwork:
    """A bridge network of pods; use as a context manager (removes everything on exit)."""

    def __init__(self, ipv6: bool = False) -> None:
        # A /24 per network, from the pid and a counter, so parallel runs do not collide.
        n = next(_seq)
        self.tag = f"pf{os.getpid() % 10000}{n}"
        self.subnet = 10 + (os.getpid() * 7 + n) % 240
        self.gateway = f"198.18.{self.subnet}.1"
        self.ipv6 = ipv6
        self.prefix6 = f"fd70:6966:{os.getpid() % 0x10000:x}:{self.subnet:x}"
        self.gateway6 = f"{self.prefix6}::1" if ipv6 else ""
        self.switch = f"{self.tag}sw"
        self.root_link = f"{self.tag}g"
        self.pods: list[Pod] = []
        self._netns: list[str] = []

    def _addr(self, host: int) -> str:
        return f"198.18.{self.subnet}.{host}"

    def start(self) -> PodNetwork:
        try:
            _ip("netns", "add", self.switch)
            self._netns.append(self.switch)
            self._in(self.switch, "link", "add", "br0", "type", "bridge")
            self._in(self.switch, "link", "set", "br0", "up")
            # The root namespace's leg: where the control plane and test servers listen.
            _ip(
                "link",
                "add",
                self.root_link,
                "type",
                "veth",
                "peer",
                "name",
                "up0",
                "netns",
                self.switch,
            )
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.root_link)
            if self.ipv6:
                _ip("-6", "addr", "add", f"{self.gateway6}/64", "dev", self.root_link, "nodad")
            _ip("link", "set", self.root_link, "up")
            self._in(self.switch, "link", "set", "up0", "master", "br0", "up")
        except BaseException:
            self.close()
            raise
        return self

    def _in(self, netns: str, *args: str) -> None:
        _ip("-n", netns, *args)

    def add_pod(self, name: str) -> Pod:
        index = len(self.pods)
        netns = f"{self.tag}{name[:6]}{index}"
        ip = self._addr(10 + index)
        _ip("netns", "add", netns)
        self._netns.append(netns)
        ip6 = f"{self.prefix6}::{10 + index:x}" if self.ipv6 else ""
        pod = Pod(name, netns, ip, self.gateway, ip6)
        self.pods.append(pod)
        leg = f"p{index}"
        _ip(
            "link",
            "add",
            "eth0",
            "netns",
            netns,
            "type",
            "veth",
            "peer",
            "name",
            leg,
            "netns",
            self.switch,
        )
        self._in(self.switch, "link", "set", leg, "master", "br0", "up")
        self._in(netns, "link", "set", "lo", "up")
        self._in(netns, "addr", "add", f"{ip}/24", "dev", "eth0")
        if ip6:
            self._in(netns, "-6", "addr", "add", f"{ip6}/64", "dev", "eth0", "nodad")
        self._in(netns, "link", "set", "eth0", "up")
        self._in(netns, "route", "add", "default", "via", self.gateway)
        etc = Path("/etc/netns") / netns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "resolv.conf").write_text(
            f"nameserver {self.gateway}\n"
            "search default.svc.cluster.local svc.cluster.local cluster.local\n"
            "options timeout:2 attempts:2\n"
        )
        return pod

    def close(self) -> None:
        for pod in self.pods:
            for proc in pod.procs:
                _kill(proc)
        for netns in reversed(self._netns):
            # Whatever still runs inside (an agent's Envoy, say) would keep the namespace.
            pids = _ip("netns", "pids", netns, check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "del", netns, check=False)
            shutil.rmtree(Path("/etc/netns") / netns, ignore_errors=True)
        self._netns.clear()
        _ip("link", "del", self.root_link, check=False)

    def __enter__(self) -> PodNetwork:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@contextlib.contextmanager
def pod_network(ipv6: bool = False) -> Iterator[PodNetwork]:
    require_netns()
    if ipv6 and not Path("/proc/net/if_inet6").exists():
        pytest.skip("dual-stack pods need IPv6 in the kernel")
    with PodNetwork(ipv6) as net:
        yield net
