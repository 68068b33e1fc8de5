"""Loopback pod addresses for tests: every test gets fresh 127/8 addresses so fixed ports
(service ports, Envoy admin) never collide with another test or a leftover process."""

from __future__ import annotations

import itertools
import os
import socket

_base = 100 + (os.getpid() % 100)
_counter = itertools.count(1)


def pod_ip() -> str:
    n = next(_counter)
    return f"127.{_base}.{n // 250}.{n % 250 + 1}"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
