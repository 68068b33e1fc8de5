"""Shared pieces of the fuzz tests: hypothesis budgets, a control plane on its own event loop
in a thread (hypothesis drives plain synchronous tests), and a log handler that collects
errors.

Budgets: every fuzz test states the number of examples it runs in `make test` (bounded, a few
seconds each); `make fuzz` sets PILOTFISH_FUZZ_SCALE to multiply them for a longer run."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import grpc
from hypothesis import HealthCheck, settings

from control.app import ControlPlane
from control.ca.identity import Identity
from tests.support.controlplane import running_control_plane

SCALE = float(os.environ.get("PILOTFISH_FUZZ_SCALE", "1"))


def fuzz_settings(max_examples: int, **kwargs: Any) -> settings:
    """`max_examples` in `make test`, times PILOTFISH_FUZZ_SCALE under `make fuzz`. No
    per-example deadline: these examples use real sockets on a shared, noisy machine."""
    return settings(
        max_examples=max(1, int(max_examples * SCALE)),
        deadline=None,
        suppress_health_check=list(HealthCheck),
        **kwargs,
    )


class ControlPlaneThread:
    """An in-process control plane on its own event loop and thread."""

    def __init__(self, cfg: Path, **options: Any) -> None:
        self.cfg = cfg
        self.options = options
        self.cp: ControlPlane | None = None
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._run(),))

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        async with running_control_plane(self.cfg, **self.options) as cp:
            self.cp = cp
            self._ready.set()
            await self._stop.wait()

    def start(self) -> None:
        self._thread.start()
        assert self._ready.wait(30)

    def stop(self) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        self._loop.close()

    @property
    def target(self) -> str:
        assert self.cp is not None
        return f"127.0.0.1:{self.cp.xds_port}"

    @property
    def secure_target(self) -> str:
        assert self.cp is not None
        return f"127.0.0.1:{self.cp.secure_xds_port}"

    def tls_credentials(self) -> grpc.ChannelCredentials:
        """For the TLS port (the CA signs nothing on the plaintext one)."""
        assert self.cp is not None and self.cp.ca is not None
        return grpc.ssl_channel_credentials(root_certificates=self.cp.ca.root_pem.encode())

    def token(self) -> str:
        assert self.cp is not None and self.cp.tokens is not None
        return self.cp.tokens.issue(Identity("default", "fuzz"), 3600, time.time())


class ErrorLog(logging.Handler):
    """Collects log records at ERROR and above (an unhandled exception in a handler, grpc.aio
    failing a batch, an asyncio task whose exception nobody retrieved)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self) -> list[str]:
        return [f"{r.name}: {r.getMessage()}" for r in self.records]

    def __enter__(self) -> ErrorLog:
        logging.getLogger().addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger().removeHandler(self)
