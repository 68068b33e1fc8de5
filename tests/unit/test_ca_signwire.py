"""The CA signing worker's wire (sans-IO): frames round-trip, and the parent's queue batches
what waits, bounds what is in flight and knows which calls a dead worker takes with it."""

from __future__ import annotations

import pytest

from control.ca.signwire import (
    HEADER_SIZE,
    CaMaterial,
    Outcome,
    SignJob,
    SignOutcome,
    SignQueue,
    WireError,
    frame_length,
    init_frame,
    parse,
    parse_init,
    parse_jobs,
    parse_outcomes,
    sign_frame,
    signed_frame,
)


def job(i: int) -> SignJob:
    return SignJob(i, f"csr-{i}".encode(), "default", "sa", 60.0, 1.5e9)


def unframe(data: bytes) -> bytes:
    n = frame_length(data[:HEADER_SIZE])
    assert len(data) == HEADER_SIZE + n
    return data[HEADER_SIZE:]


def test_frames_round_trip() -> None:
    material = CaMaterial(("leaf", "root"), b"key", "cluster.local", 3600.0)
    assert parse_init(parse(unframe(init_frame(material)))) == material
    jobs = [job(1), job(2)]
    assert parse_jobs(parse(unframe(sign_frame(jobs)))) == jobs
    outcomes = [SignOutcome(1, Outcome.SIGNED, "pem"), SignOutcome(2, Outcome.BAD_CSR, "why")]
    assert parse_outcomes(parse(unframe(signed_frame(outcomes)))) == outcomes


def test_a_corrupt_stream_is_a_wire_error() -> None:
    with pytest.raises(WireError):
        frame_length(b"\xff\xff\xff\xff")  # 4 GiB: not a frame of ours
    with pytest.raises(WireError):
        parse(b"not a pickle")
    with pytest.raises(WireError, match="expected signed"):
        parse_outcomes(parse(unframe(sign_frame([job(1)]))))


def test_what_waits_goes_as_one_batch_when_the_pipe_has_room() -> None:
    q = SignQueue(max_in_flight=1)
    q.add(job(1))
    assert q.next_batch() == [job(1)]
    for i in (2, 3, 4):
        q.add(job(i))
    assert q.next_batch() is None  # the pipe is full: 2..4 wait together
    assert (q.waiting, q.in_flight, len(q)) == (3, 1, 4)
    q.answered([SignOutcome(1, Outcome.SIGNED, "")])
    assert q.next_batch() == [job(2), job(3), job(4)]
    assert q.next_batch() is None


def test_batches_are_bounded_and_pipelined() -> None:
    q = SignQueue(max_in_flight=2, max_batch=2)
    for i in range(1, 6):
        q.add(job(i))
    assert q.next_batch() == [job(1), job(2)]
    assert q.next_batch() == [job(3), job(4)]
    assert q.next_batch() is None
    q.answered([SignOutcome(1, Outcome.SIGNED, ""), SignOutcome(2, Outcome.FAILED, "")])
    assert q.next_batch() == [job(5)]


def test_a_reply_must_answer_the_oldest_batch() -> None:
    q = SignQueue()
    with pytest.raises(WireError, match="no batch in flight"):
        q.answered([])
    q.add(job(1))
    q.next_batch()
    with pytest.raises(WireError, match="does not match"):
        q.answered([SignOutcome(7, Outcome.SIGNED, "")])


def test_a_dead_worker_takes_only_what_it_had() -> None:
    q = SignQueue(max_in_flight=1)
    q.add(job(1))
    q.next_batch()
    q.add(job(2))
    q.add(job(3))
    q.discard(3)  # its caller went away before it was sent
    assert q.lost() == [1]
    assert q.next_batch() == [job(2)]  # for the next worker
    q.add(job(4))
    assert q.drain() == [2, 4]
    assert len(q) == 0
