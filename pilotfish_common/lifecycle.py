"""`async with` for objects that have `start()` and `close()`, and closing several in order."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol, Self


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


class Closable(Protocol):
    async def close(self) -> object: ...


async def close_each(*parts: Closable | None) -> None:
    """`close()` each of `parts` in the order given (an owner's reverse start order), one
    after the other; None entries (parts that this configuration does not have) are skipped."""
    for part in parts:
        if part is not None:
            await part.close()
