"""The CA's BatchSigner: signs off the loop on one thread, a batch per hop, and hands each
caller its own result or its own error."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading

import pytest

from control.ca.identity import Identity
from control.ca.service import BatchSigner

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


async def test_each_caller_gets_its_own_result_and_calls_batch_up() -> None:
    loop_thread = threading.get_ident()
    threads: set[int] = set()
    release = threading.Event()
    calls: list[bytes] = []

    def sign(csr: bytes, identity: Identity, ttl: float, now: dt.datetime) -> list[str]:
        threads.add(threading.get_ident())
        release.wait(5)  # hold the first batch so that the others queue up behind it
        calls.append(csr)
        if csr == b"bad":
            raise ValueError("bad csr")
        return [f"{csr.decode()}:{identity.service_account}:{ttl:.0f}"]

    signer = BatchSigner(sign)
    try:
        first = asyncio.create_task(signer.sign(b"a", Identity("ns", "sa"), 10, NOW))
        await asyncio.sleep(0.05)  # "a" is on the signing thread now, alone
        rest = [
            asyncio.create_task(signer.sign(c, Identity("ns", "sa"), 20, NOW))
            for c in (b"b", b"bad", b"c")
        ]
        await asyncio.sleep(0.05)
        release.set()
        assert await first == ["a:sa:10"]
        assert await rest[0] == ["b:sa:20"]
        with pytest.raises(ValueError, match="bad csr"):
            await rest[1]
        assert await rest[2] == ["c:sa:20"]
        assert calls == [b"a", b"b", b"bad", b"c"]
        assert loop_thread not in threads and len(threads) == 1
    finally:
        signer.close()


async def test_a_cancelled_caller_does_not_stop_the_others() -> None:
    gate = threading.Event()

    def sign(csr: bytes, identity: Identity, ttl: float, now: dt.datetime) -> list[str]:
        gate.wait(5)
        return [csr.decode()]

    signer = BatchSigner(sign)
    try:
        gone = asyncio.create_task(signer.sign(b"x", Identity("ns", "sa"), 1, NOW))
        kept = asyncio.create_task(signer.sign(b"y", Identity("ns", "sa"), 1, NOW))
        await asyncio.sleep(0.05)
        gone.cancel()
        gate.set()
        assert await kept == ["y"]
        assert await signer.sign(b"z", Identity("ns", "sa"), 1, NOW) == ["z"]
    finally:
        signer.close()
