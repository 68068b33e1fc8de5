"""Reading a pod's Envoy through its admin port (`<pod ip>:15000`), and plain HTTP calls, for
tests that wait until a config change has really taken effect in Envoy."""

from __future__ import annotations

import re

import aiohttp

ADMIN_PORT = 15000
# The standard metrics' HTTP logger is Envoy's file logger too, on the agent's metrics FIFO
# (`<workdir>/METRICS`): in a config dump, its path's end.
_METRICS_LOG = '/METRICS"'
_FILE_LOGGER = "access_loggers.file.v3.FileAccessLog"


def metrics_loggers(dump: str) -> int:
    """The standard metrics' HTTP loggers in a config dump."""
    return dump.count(_METRICS_LOG)


def metric_overrides(dump: str) -> bool:
    """Whether a config dump's metrics loggers carry Telemetry overrides: the TCP loggers'
    tag, or its value (JSON, quoted once more in the dump) inside an HTTP record format."""
    return re.search(r'"tag":\s*"metric_overrides"', dump) is not None or any(
        key in dump for key in ('\\"disabled\\":[', '\\"removed\\":{')
    )


def file_loggers(dump: str) -> int:
    """File access loggers in a config dump other than the standard metrics' (a user's)."""
    return dump.count(_FILE_LOGGER) - metrics_loggers(dump)


async def admin_text(ip: str, path: str) -> str | None:
    """The body of an admin endpoint, or None when Envoy does not answer (yet)."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s,
            s.get(f"http://{ip}:{ADMIN_PORT}{path}") as r,
        ):
            return await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return None


async def dynamic_listeners(ip: str) -> str | None:
    """The listeners Envoy runs now, as its config dump JSON."""
    return await admin_text(ip, "/config_dump?resource=dynamic_listeners")


async def counter(ip: str, pattern: str) -> int:
    """The sum of the stats whose names match the regex `pattern` (-1: no answer)."""
    text = await admin_text(ip, f"/stats?filter={pattern}")
    if text is None:
        return -1
    return sum(int(line.rpartition(" ")[2]) for line in text.splitlines() if line.strip())


async def draining(ip: str) -> int:
    """Listeners and filter chains Envoy still drains after an update: their connections keep
    the old config until they close, so a change is complete only at 0."""
    return await counter(ip, "^listener_manager.total_.*draining$")


async def status_of(url: str, host: str, session: aiohttp.ClientSession | None = None) -> int:
    """GET `url` with a Host header: the status, or 0 when the call fails."""
    try:
        if session is not None:
            async with session.get(url, headers={"Host": host}) as r:
                await r.read()
                return r.status
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s,
            s.get(url, headers={"Host": host}) as r,
        ):
            await r.read()
            return r.status
    except (aiohttp.ClientError, TimeoutError):
        return 0
