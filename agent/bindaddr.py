"""Listening addresses given to the event loop in a form it does not IDNA-encode.

uvloop encodes a `str` host with the `idna` codec before resolving it, even an IP literal, and
the codec's first use imports encodings.idna, stringprep and unicodedata (~1.5 ms of the
agent's start, on the way to ready, and their memory for its life). The agent listens on IP
literals (its config checks them) and loopback: an ASCII host goes as bytes, which uvloop
passes on as they are, and a UDP socket is bound here from the host as bytes. A non-ASCII
name still goes through the loop's own resolution.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import cast


def server_hosts(host: str) -> Sequence[str]:
    """`host` for `loop.create_server` / `asyncio.start_server`."""
    if not host.isascii():
        return [host]
    # Typed as str by typeshed; both uvloop and asyncio's own loop take bytes hosts.
    return cast(Sequence[str], [host.encode("ascii")])


def udp_socket(host: str, port: int) -> socket.socket | None:
    """A non-blocking UDP socket bound to the IP literal `host`, or None when `host` is not
    one (let the loop resolve it: `create_datagram_endpoint(local_addr=...)`)."""
    if not host.isascii():
        return None
    try:
        # bytes: socket.getaddrinfo, too, IDNA-encodes a str host.
        infos = socket.getaddrinfo(
            host.encode("ascii"),
            port,
            type=socket.SOCK_DGRAM,
            flags=socket.AI_NUMERICHOST | socket.AI_PASSIVE,
        )
    except socket.gaierror:
        return None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setblocking(False)
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    return sock
