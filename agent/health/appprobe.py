"""Runs the app's original probes for the kubelet (`/app-health/<container>/<kind>` on the
status port), as Istio's agent does: from inside the pod, to the pod IP (or to loopback with
Istio's REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION=true), in plaintext and outside the capture:
the capture rules exclude the proxy's UID/GID 1337, which the agent's connections carry (in a
Kubernetes pod the container runs as 1337; as root in mode REDIRECT the agent joins GID 1337),
and a connection made inside the pod never passes the inbound (PREROUTING) rules.

The kubelet gets the probe's outcome: for httpGet the app's status code and the start of its
body (so the kubelet's own 200-399 rule and its event messages are the app's); for tcpSocket
and grpc 200, or 503 with the reason. A probe that cannot reach the app or times out is 503.
The kubelet's request headers are passed on (Host with the status port replaced by the
app's), then the probe's own `httpHeaders` replace any of the same name, as Istio does.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Mapping

from agent.health import checks
from agent.health.appprobers import AppProber

logger = logging.getLogger(__name__)

# The kubelet keeps at most 10 KiB of a probe's body for its events.
MAX_BODY = 10 << 10
_HOP_BY_HOP = frozenset(
    (
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
    )
)


def probe_destination(pod_ip: str, legacy_localhost: bool) -> str:
    if not legacy_localhost:
        return pod_ip
    return "::1" if ipaddress.ip_address(pod_ip).version == 6 else "127.0.0.1"


def forwarded_headers(
    prober: AppProber, request_headers: Mapping[str, str], status_port: int
) -> tuple[tuple[str, str], ...]:
    """What the app gets: the kubelet's headers (hop-by-hop ones dropped), the Host pointing
    at the app's port when it named the status port, then the probe's headers over them."""
    out: dict[str, tuple[str, str]] = {}
    for name, value in request_headers.items():
        key = name.lower()
        if key in _HOP_BY_HOP:
            continue
        if key == "host":
            value = _replace_port(value, status_port, prober.port)
        out[key] = (name, value)
    for name, value in prober.headers:
        out[name.lower()] = (name, value)
    return tuple(out.values())


def _replace_port(authority: str, old: int, new: int) -> str:
    host, sep, port = authority.rpartition(":")
    if not sep or port != str(old):
        return authority
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        return authority  # a bare IPv6 address: its last group is not a port
    return f"{host}:{new}"


class AppProbes:
    """The status server's handler for the app-health paths."""

    def __init__(
        self, probers: Mapping[str, AppProber], destination: str, status_port: int
    ) -> None:
        self.probers = dict(probers)
        self.destination = destination
        self.status_port = status_port

    async def answer(self, path: str, request_headers: Mapping[str, str]) -> tuple[int, bytes]:
        """(status, body) for the kubelet; 404 for a path no prober has."""
        prober = self.probers.get(path)
        if prober is None:
            return 404, b"app prober config does not exist for " + path.encode() + b"\n"
        try:
            async with asyncio.timeout(prober.timeout):
                return await self._run(prober, request_headers)
        except TimeoutError:
            reason = f"{prober.kind} probe timed out after {prober.timeout:g}s"
        except checks.CheckError as e:
            reason = str(e)
        logger.debug("app probe %s failed: %s", path, reason)
        return 503, reason.encode() + b"\n"

    async def _run(
        self, prober: AppProber, request_headers: Mapping[str, str]
    ) -> tuple[int, bytes]:
        host = self.destination
        if prober.kind == "httpGet":
            headers = forwarded_headers(prober, request_headers, self.status_port)
            return await checks.http_status(
                host,
                prober.port,
                prober.path,
                https=prober.https,
                headers=headers,
                max_body=MAX_BODY,
            )
        if prober.kind == "grpc":
            error = await checks.grpc_health(host, prober.port, prober.service)
        else:
            error = await checks.tcp_connect(host, prober.port)
        if error is None:
            return 200, b"OK\n"
        raise checks.CheckError(error)
