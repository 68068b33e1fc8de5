"""What every config source (files, the Kubernetes API) does with a merged config: report its
warnings once each, and hand it to the control plane without letting a failing handler take
the source down."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable

from control.model.types import ConfigWarning, MeshConfig

ChangeHandler = Callable[[MeshConfig], Awaitable[None] | None]


class WarningLog:
    """Logs a warning when it first appears, and again only if it went away and came back."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._logged: set[ConfigWarning] = set()

    def update(self, warnings: Iterable[ConfigWarning]) -> None:
        current = list(warnings)
        for warning in current:
            if warning not in self._logged:
                self._logger.warning("%s", warning)
        self._logged = set(current)


async def deliver(handler: ChangeHandler, config: MeshConfig, logger: logging.Logger) -> None:
    """Call the change handler (plain or async); its failure is logged, never raised."""
    try:
        result = handler(config)
        if inspect.isawaitable(result):
            await result
    except asyncio.CancelledError:
        raise
    except Exception:
        logger.exception("config change handler failed")
