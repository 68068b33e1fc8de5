"""`pilotfish-agent wait`: return once the agent's status server says ready, as Istio's
`pilot-agent wait`. It runs as the agent container's postStart hook
(`holdApplicationUntilProxyStarts`): kubelet starts the next container only after the hook
returns, so the app's first connection already finds Envoy configured.

The poll schedule and the verdict are sans-IO (`WaitSchedule`: outcomes and `now` in, the
next poll or the exit out); `main` only performs the GETs. Started once per pod start, so it
imports nothing heavy (no grpc, no protos): the HTTP is agent/httpio.py's one-shot client.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from dataclasses import dataclass

from agent.httpio import HttpClientError, fetch

logger = logging.getLogger(__name__)

READY_PATH = "/healthz/ready"
DEFAULT_STATUS_PORT = 15020  # the agent's own default (agent/config.py)
DEFAULT_TIMEOUT = 60.0
DEFAULT_PERIOD = 0.2
DEFAULT_REQUEST_TIMEOUT = 0.5
_DETAIL_MAX = 200  # a 503 body is the agent's one-line reason; anything longer is cut


class WaitError(ValueError):
    """Flags that make no sense (a negative timeout, a URL that is not http://)."""


@dataclass(frozen=True, slots=True)
class WaitSettings:
    url: str
    timeout: float = DEFAULT_TIMEOUT
    period: float = DEFAULT_PERIOD
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT


@dataclass(frozen=True, slots=True)
class Outcome:
    """One GET: the status (None when there was no HTTP answer) and what to report."""

    status: int | None
    detail: str


@dataclass(frozen=True, slots=True)
class Poll:
    """Send the next GET at `at` (monotonic seconds), giving it `request_timeout`."""

    at: float
    request_timeout: float


@dataclass(frozen=True, slots=True)
class Finish:
    code: int
    message: str


class WaitSchedule:
    """When to poll and when to give up. Polls start `period` apart (a slow answer eats into
    the gap rather than adding to it), no request outlives the deadline, and the last
    outcome is the reason given on timeout."""

    def __init__(self, settings: WaitSettings, started: float) -> None:
        self.settings = settings
        self.deadline = started + settings.timeout
        self._next = started

    def first(self) -> Poll:
        return self._poll(self._next)

    def after(self, outcome: Outcome, sent: float, now: float) -> Poll | Finish:
        """The decision once the GET sent at `sent` ended with `outcome` at `now`."""
        if outcome.status == 200:
            return Finish(0, f"ready: {self.settings.url}")
        if now >= self.deadline:
            return Finish(
                1,
                f"not ready after {self.settings.timeout:g}s: {self.settings.url}: "
                f"{outcome.detail}",
            )
        return self._poll(max(now, min(sent + self.settings.period, self.deadline)))

    def _poll(self, at: float) -> Poll:
        # At least a little time for the last request, even at the deadline.
        remaining = max(self.deadline - at, 0.05)
        return Poll(at, min(self.settings.request_timeout, remaining))


def describe(status: int | None, body: bytes = b"", error: BaseException | None = None) -> str:
    """One line for an outcome: `503 no LDS yet`, or the connection error."""
    if status is not None:
        text = " ".join(body.decode("utf-8", "replace").split())[:_DETAIL_MAX]
        return f"{status} {text}".rstrip()
    if isinstance(error, TimeoutError):
        return "no answer within the request timeout"
    if isinstance(error, OSError):
        # asyncio's "Connect call failed ('10.0.0.1', 15020)" repeats the URL; the errno's
        # text ("Connection refused") is the part worth a line.
        return os.strerror(error.errno) if error.errno else str(error) or type(error).__name__
    return str(error) or type(error).__name__


async def wait_ready(settings: WaitSettings) -> Finish:
    loop = asyncio.get_running_loop()
    schedule = WaitSchedule(settings, loop.time())
    step: Poll | Finish = schedule.first()
    while isinstance(step, Poll):
        delay = step.at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        sent = loop.time()
        try:
            status, body = await fetch(settings.url, timeout=step.request_timeout)
            outcome = Outcome(status, describe(status, body))
        except (OSError, TimeoutError, HttpClientError) as e:
            outcome = Outcome(None, describe(None, error=e))
        logger.debug("%s: %s", settings.url, outcome.detail)
        step = schedule.after(outcome, sent, loop.time())
    return step


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pilotfish-agent wait",
        description=(
            "Poll the agent's readiness (GET /healthz/ready on its status port) and exit 0 "
            "once it answers 200, or 1 after the timeout with the last answer or error. "
            "Istio's pilot-agent wait flags (--timeoutSeconds, --periodMillis, "
            "--requestTimeoutMillis) are accepted too."
        ),
    )
    p.add_argument(
        "--url", default=None, help="readiness URL (default: built from --ip/--status-port)"
    )
    p.add_argument(
        "--ip",
        default=os.environ.get("INSTANCE_IP", "127.0.0.1"),
        help="the agent's IP (INSTANCE_IP, else 127.0.0.1)",
    )
    p.add_argument("--status-port", type=int, default=DEFAULT_STATUS_PORT)
    p.add_argument(
        "--timeout", type=float, default=None, help=f"seconds (default {DEFAULT_TIMEOUT:g})"
    )
    p.add_argument(
        "--period",
        type=float,
        default=None,
        help=f"seconds between polls (default {DEFAULT_PERIOD:g})",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        help=f"seconds per request (default {DEFAULT_REQUEST_TIMEOUT:g})",
    )
    p.add_argument(
        "--timeoutSeconds", dest="timeout_s", type=float, default=None, help=argparse.SUPPRESS
    )
    p.add_argument(
        "--periodMillis", dest="period_ms", type=float, default=None, help=argparse.SUPPRESS
    )
    p.add_argument(
        "--requestTimeoutMillis",
        dest="request_timeout_ms",
        type=float,
        default=None,
        help=argparse.SUPPRESS,
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log every poll to stderr")
    return p


def _pick(ours: float | None, istio_seconds: float | None, default: float) -> float:
    """Our flag, else Istio's (already in seconds), else the default."""
    if ours is not None:
        return ours
    if istio_seconds is not None:
        return istio_seconds
    return default


def _ms(value: float | None) -> float | None:
    return None if value is None else value / 1000.0


def settings_from_args(args: argparse.Namespace) -> WaitSettings:
    if args.url is not None:
        url = args.url
    else:
        if not 0 < args.status_port < 65536:
            raise WaitError(f"--status-port: {args.status_port} is not a port")
        host = f"[{args.ip}]" if ":" in args.ip else args.ip
        url = f"http://{host}:{args.status_port}{READY_PATH}"
    if not url.startswith("http://"):
        raise WaitError(f"--url: {url!r} is not an http:// URL")
    settings = WaitSettings(
        url=url,
        timeout=_pick(args.timeout, args.timeout_s, DEFAULT_TIMEOUT),
        period=_pick(args.period, _ms(args.period_ms), DEFAULT_PERIOD),
        request_timeout=_pick(
            args.request_timeout, _ms(args.request_timeout_ms), DEFAULT_REQUEST_TIMEOUT
        ),
    )
    for name in ("timeout", "period", "request_timeout"):
        if getattr(settings, name) <= 0:
            raise WaitError(f"--{name.replace('_', '-')}: must be more than 0")
    return settings


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from_args(args)
    except WaitError as e:
        print(f"pilotfish-agent wait: {e}", file=sys.stderr)
        return 2
    if args.verbose:
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(message)s")
    started = time.monotonic()
    finish = asyncio.run(wait_ready(settings))
    line = f"pilotfish-agent wait: {finish.message}"
    if finish.code == 0:
        print(f"{line} ({time.monotonic() - started:.2f}s)")
    else:
        print(line, file=sys.stderr)
    return finish.code
