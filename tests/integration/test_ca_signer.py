"""The CA's signing worker process (control/ca/signer.py + signworker.py), for real: a
`python -m control.ca.signworker` child signs real CSRs; killing it mid-batch fails only the
calls it held, and a new worker takes the rest."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from control.ca.authority import CertificateAuthority, CsrError, in_memory_authority
from control.ca.identity import Identity
from control.ca.signer import ProcessSigner, SignerUnavailable
from tests.support.pki import load_chain, make_csr, spiffe_ids, verify_chain

CART = Identity("shop", "cart")


@pytest.fixture
def ca() -> CertificateAuthority:
    return in_memory_authority("cluster.local")


@pytest.fixture
async def signer(ca: CertificateAuthority) -> AsyncIterator[ProcessSigner]:
    async with ProcessSigner(ca) as s:
        yield s


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def proc_file(pid: int, name: str) -> bytes:
    return Path(f"/proc/{pid}/{name}").read_bytes()


async def test_signs_concurrent_calls_with_the_callers_identity(
    signer: ProcessSigner, ca: CertificateAuthority
) -> None:
    csrs = [make_csr(san="spiffe://cluster.local/ns/kube-system/sa/admin") for _ in range(20)]
    chains = await asyncio.gather(*(signer.sign(c, CART, 600, now()) for c in csrs))
    serials = set()
    for pems in chains:
        assert pems[1:] == ca.chain_pems
        chain = load_chain(pems)
        verify_chain(chain)
        assert spiffe_ids(chain[0]) == ["spiffe://cluster.local/ns/shop/sa/cart"]
        leaf = chain[0]
        assert leaf.not_valid_after_utc - leaf.not_valid_before_utc == dt.timedelta(seconds=600)
        serials.add(leaf.serial_number)
    assert len(serials) == 20


async def test_a_bad_csr_fails_alone(signer: ProcessSigner) -> None:
    results = await asyncio.gather(
        signer.sign(make_csr(), CART, 60, now()),
        signer.sign(b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n", CART, 60, now()),
        signer.sign(make_csr(), CART, -5, now()),
        signer.sign(make_csr(), CART, 60, now()),
        return_exceptions=True,
    )
    assert isinstance(results[0], list) and isinstance(results[3], list)
    assert isinstance(results[1], CsrError) and "not a PEM" in str(results[1])
    assert isinstance(results[2], CsrError) and "negative" in str(results[2])
    assert signer.restarts == 0


async def test_the_key_never_shows_on_the_command_line_or_in_the_environment(
    signer: ProcessSigner,
) -> None:
    await signer.sign(make_csr(), CART, 60, now())  # the worker has the key by now
    pid = signer.pid
    assert pid is not None
    assert b"control.ca.signworker" in proc_file(pid, "cmdline")
    for name in ("cmdline", "environ"):
        assert b"PRIVATE KEY" not in proc_file(pid, name)


async def test_a_killed_worker_fails_the_calls_it_held_and_a_new_one_signs_the_rest(
    signer: ProcessSigner,
) -> None:
    await signer.sign(make_csr(), CART, 60, now())
    first = signer.pid
    assert first is not None
    # Stopped, the worker holds what is written to it: the first two calls (two batches in
    # flight at most); the others wait in the parent for the pipe to have room.
    os.kill(first, signal.SIGSTOP)
    calls = [asyncio.create_task(signer.sign(make_csr(), CART, 60, now())) for _ in range(6)]
    await asyncio.sleep(0.1)
    assert not any(c.done() for c in calls)
    os.kill(first, signal.SIGKILL)
    results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 30)
    assert [type(r) for r in results[:2]] == [SignerUnavailable, SignerUnavailable]
    assert all(isinstance(r, list) for r in results[2:]), results
    assert signer.restarts == 1 and signer.pid not in (None, first)
    verify_chain(load_chain(await signer.sign(make_csr(), CART, 60, now())))


async def test_a_group_signal_does_not_take_the_worker_away(signer: ProcessSigner) -> None:
    """Ctrl-C or a SIGTERM to the process group reaches the worker too; the control plane
    decides when it stops (by closing its stdin)."""
    await signer.sign(make_csr(), CART, 60, now())
    pid = signer.pid
    assert pid is not None
    os.kill(pid, signal.SIGTERM)
    os.kill(pid, signal.SIGINT)
    await asyncio.sleep(0.1)
    await signer.sign(make_csr(), CART, 60, now())
    assert signer.pid == pid and signer.restarts == 0


async def test_close_stops_the_worker_and_later_calls_are_unavailable(
    ca: CertificateAuthority,
) -> None:
    signer = ProcessSigner(ca)
    await signer.start()
    await signer.sign(make_csr(), CART, 60, now())
    pid = signer.pid
    assert pid is not None
    await signer.close()
    assert signer.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone, and reaped
    with pytest.raises(SignerUnavailable):
        await signer.sign(make_csr(), CART, 60, now())
    await signer.close()  # idempotent
