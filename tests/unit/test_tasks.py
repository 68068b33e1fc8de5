"""pilotfish_common/tasks.py: the timer loop shared by the push debounce and the workload
expiry."""

from __future__ import annotations

import asyncio

from pilotfish_common.tasks import at_deadlines, cancel


async def test_at_deadlines_acts_once_per_deadline_and_follows_wake() -> None:
    wake = asyncio.Event()
    due: list[float] = []
    acted: list[float] = []
    loop = asyncio.get_running_loop()

    async def act(now: float) -> None:
        acted.append(now)
        due.pop(0)  # moves the deadline past `now`, as the loop requires

    task = asyncio.create_task(at_deadlines(wake, lambda: due[0] if due else None, loop.time, act))
    await asyncio.sleep(0.02)
    assert acted == []  # nothing due: waits for `wake` alone
    start = loop.time()
    due.append(start + 0.05)
    wake.set()
    await asyncio.sleep(0.2)
    assert len(acted) == 1 and acted[0] >= start + 0.05
    await cancel(task)
    assert task.cancelled()
