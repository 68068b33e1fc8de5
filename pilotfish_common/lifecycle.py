"""`async with` for objects that have `start()` and `close()`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Self


class Lifecycle(ABC):
    """`async with x:` is `await x.start()` ... `await x.close()`, and `close()` runs however
    the block ends. Owners that need `start()`'s result, or order several objects by hand,
    call the two directly."""

    @abstractmethod
    async def start(self) -> object:
        """Acquire what the object needs (sockets, tasks, processes); may return a result
        (a bound port, say) for callers that do not use `async with`."""

    @abstractmethod
    async def close(self) -> object:
        """Release everything `start()` acquired; may return a result (an exit code, say)."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
