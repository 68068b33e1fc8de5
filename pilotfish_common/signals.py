"""The signals that stop a command."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

# Every command exits cleanly on both: SIGTERM from Kubernetes or systemd, SIGINT from a
# terminal's Ctrl-C.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def on_stop(callback: Callable[[], object]) -> None:
    """Call `callback` on the running loop when SIGTERM or SIGINT arrives (instead of the
    default: dying, or KeyboardInterrupt, mid-shutdown)."""
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, callback)
