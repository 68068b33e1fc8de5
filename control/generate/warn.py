"""warn_once: how generators report a config problem. They run on every push, so a problem that
persists is logged once, not once per push.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable

log = logging.getLogger(__name__)


class _WarnOnce:
    """Logs a warning the first time its key is seen: generators run on every push, and a
    config problem that persists should not flood the log. Bounded so churn cannot leak."""

    def __init__(self, limit: int = 10_000) -> None:
        self._seen: set[Hashable] = set()
        self._limit = limit

    def __call__(self, key: Hashable, msg: str, *args: object) -> None:
        if key in self._seen:
            return
        if len(self._seen) >= self._limit:
            self._seen.clear()
        self._seen.add(key)
        log.warning(msg, *args)

    def clear(self) -> None:
        """Forget what was reported, so every problem is logged again once."""
        self._seen.clear()


warn_once = _WarnOnce()
