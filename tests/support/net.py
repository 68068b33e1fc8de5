"""Loopback pod addresses for tests: every test gets fresh 127/8 addresses so fixed ports
(service ports, Envoy admin) never collide with another test or a leftover process."""

from __future__ import annotations

import itertools
import os
import socket

_counter = itertools.count(1)
_claim: socket.socket | None = None
_base = 0
# A socket bound in a /16 marks it taken for as long as this process lives.
_CLAIM_PORT = 65431


def _claim_block() -> int:
    """A 127.N/16 no other test process is using. Starting from the pid spreads processes
    out; the claim socket settles the rest (two pytest runs at once, a benchmark beside the
    suite: the same N would mean the same pod addresses and their fixed ports)."""
    global _claim
    first = os.getpid() % 100
    for i in range(100):
        base = 100 + (first + i) % 100
        s = socket.socket()
        try:
            s.bind((f"127.{base}.255.254", _CLAIM_PORT))
        except OSError:
            s.close()
            continue
        _claim = s
        return base
    raise RuntimeError("every 127.100-199/16 block is claimed by another test process")


def pod_ip() -> str:
    global _base
    if not _base:
        _base = _claim_block()
    n = next(_counter)
    return f"127.{_base}.{n // 250}.{n % 250 + 1}"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
