"""What the control plane and its signing worker process (control/ca/signworker.py) say to
each other over the worker's stdin and stdout, and the batching rules of the parent side.
Sans-IO: bytes and messages in, bytes and decisions out.

Frames are a 4-byte big-endian length and a pickle of plain tuples. Pickle is safe here only
because both ends are ours: the pipe is created by the control plane for a child it started
from its own code, and nothing else can write to it.

    parent -> worker   ("init", CaMaterial)           once, first
    parent -> worker   ("sign", [SignJob, ...])        a batch
    worker -> parent   ("signed", [SignOutcome, ...])  one per batch, in the batch's order

The worker answers batches in the order they came, so the parent matches a reply to the
oldest batch it has in flight.
"""

from __future__ import annotations

import enum
import pickle
import struct
from collections import deque
from dataclasses import dataclass
from typing import Any

_LENGTH = struct.Struct(">I")
MAX_FRAME = 64 << 20  # far above any batch; a larger length means the stream is corrupt


class WireError(ValueError):
    """A frame that cannot come from our own peer (corrupt stream)."""


@dataclass(frozen=True, slots=True)
class CaMaterial:
    """Everything the worker needs to sign as this CA. The key travels through the pipe only
    (never a command line, an environment variable or a file)."""

    cert_pems: tuple[str, ...]  # signing cert first, then up to the root
    key_pem: bytes  # PKCS#8, unencrypted
    trust_domain: str
    max_workload_ttl: float


@dataclass(frozen=True, slots=True)
class SignJob:
    id: int
    csr_pem: bytes
    namespace: str
    service_account: str
    ttl: float  # seconds asked for (0: the maximum)
    now: float  # POSIX timestamp the certificate starts at


class Outcome(enum.IntEnum):
    SIGNED = 0  # text: the leaf's PEM
    BAD_CSR = 1  # text: why the CSR was refused (the caller's fault)
    FAILED = 2  # text: what went wrong inside the CA


@dataclass(frozen=True, slots=True)
class SignOutcome:
    id: int
    outcome: Outcome
    text: str


def frame(message: tuple[Any, ...]) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(payload)) + payload


def init_frame(material: CaMaterial) -> bytes:
    return frame(
        (
            "init",
            material.cert_pems,
            material.key_pem,
            material.trust_domain,
            material.max_workload_ttl,
        )
    )


def sign_frame(jobs: list[SignJob]) -> bytes:
    return frame(
        ("sign", [(j.id, j.csr_pem, j.namespace, j.service_account, j.ttl, j.now) for j in jobs])
    )


def signed_frame(outcomes: list[SignOutcome]) -> bytes:
    return frame(("signed", [(o.id, int(o.outcome), o.text) for o in outcomes]))


def frame_length(header: bytes) -> int:
    (n,) = _LENGTH.unpack(header)
    if n > MAX_FRAME:
        raise WireError(f"frame of {n} bytes")
    return int(n)


HEADER_SIZE = _LENGTH.size


def parse(payload: bytes) -> tuple[Any, ...]:
    try:
        message = pickle.loads(payload)
    except Exception as e:
        raise WireError(f"undecodable frame: {e}") from None
    if not isinstance(message, tuple) or not message or not isinstance(message[0], str):
        raise WireError("frame is not a message")
    return message


def parse_init(message: tuple[Any, ...]) -> CaMaterial:
    if message[0] != "init" or len(message) != 5:
        raise WireError(f"expected init, got {message[0]!r}")
    _, pems, key, domain, ttl = message
    return CaMaterial(tuple(pems), key, domain, float(ttl))


def parse_jobs(message: tuple[Any, ...]) -> list[SignJob]:
    if message[0] != "sign" or len(message) != 2:
        raise WireError(f"expected sign, got {message[0]!r}")
    return [SignJob(*job) for job in message[1]]


def parse_outcomes(message: tuple[Any, ...]) -> list[SignOutcome]:
    if message[0] != "signed" or len(message) != 2:
        raise WireError(f"expected signed, got {message[0]!r}")
    return [SignOutcome(i, Outcome(kind), text) for i, kind, text in message[1]]


class SignQueue:
    """The parent's side: jobs waiting for the worker and the batches it is signing.

    Everything that waits goes to the worker as one batch when the pipe has room: under load
    a batch per pipe round trip instead of a round trip per certificate. Up to
    `max_in_flight` batches are in the pipe, so the worker starts on the next batch while the
    loop is still handing out the previous one's results."""

    def __init__(self, max_in_flight: int = 2, max_batch: int = 64) -> None:
        self.max_in_flight = max_in_flight
        self.max_batch = max_batch
        self._waiting: dict[int, SignJob] = {}
        self._in_flight: deque[list[int]] = deque()

    def __len__(self) -> int:
        return len(self._waiting) + sum(len(b) for b in self._in_flight)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def add(self, job: SignJob) -> None:
        self._waiting[job.id] = job

    def discard(self, job_id: int) -> None:
        """The caller went away: a job not yet sent is not sent (one in flight is signed
        anyway; its result is dropped)."""
        self._waiting.pop(job_id, None)

    def next_batch(self) -> list[SignJob] | None:
        """The batch to write now, or None (nothing waits, or the pipe is full)."""
        if not self._waiting or len(self._in_flight) >= self.max_in_flight:
            return None
        ids = list(self._waiting)[: self.max_batch]
        batch = [self._waiting.pop(i) for i in ids]
        self._in_flight.append(ids)
        return batch

    def answered(self, outcomes: list[SignOutcome]) -> None:
        """The worker answered its oldest batch."""
        if not self._in_flight:
            raise WireError("a reply with no batch in flight")
        sent = self._in_flight.popleft()
        if [o.id for o in outcomes] != sent:
            raise WireError("a reply that does not match the batch sent")

    def lost(self) -> list[int]:
        """The worker died: the jobs it had, which are not retried (one of them may be what
        killed it). Jobs still waiting go to the next worker."""
        ids = [i for batch in self._in_flight for i in batch]
        self._in_flight.clear()
        return ids

    def drain(self) -> list[int]:
        """Closing: every job, waiting or in flight."""
        ids = self.lost() + list(self._waiting)
        self._waiting.clear()
        return ids
