"""Pieces shared by the SotW and delta stream state machines: per-type sync status and the
push order (wire rule 6)."""

from __future__ import annotations

import array
import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from protos import typeurls

# The subscription name that asks for every resource of a type (SotW and delta alike).
WILDCARD = "*"


class SyncStatus(enum.StrEnum):
    SYNCED = "SYNCED"
    STALE = "STALE"
    NOT_SENT = "NOT_SENT"
    ERROR = "ERROR"


class RequestKind(enum.StrEnum):
    """How a request was classified; for logs, metrics and tests."""

    INITIAL = "initial"  # first request for a type on this stream
    ACK = "ack"
    NACK = "nack"
    STALE = "stale"  # SotW: nonce is not the last one sent for the type; ignored
    UPDATE = "update"  # subscription change without a response nonce


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    type_url: str
    kind: RequestKind
    # True when the server must answer now even if nothing changed (new names, first request).
    must_respond: bool
    error_message: str = ""


# The outcomes without an error message, by (type, kind, must_respond): one object each
# instead of one per request (frozen, so shared safely). Every ACK of every stream needs
# one, and a push to a thousand streams brings a thousand ACKs. Bounded: clients name the
# types, so past the bound an outcome is built for the request as before.
_outcomes: dict[tuple[str, RequestKind, bool], RequestOutcome] = {}


def shared_outcome(type_url: str, kind: RequestKind, must_respond: bool) -> RequestOutcome:
    """The outcome of a request that carries no error message, shared by every request that
    comes to the same (SotW and delta alike: the stream kind is not part of an outcome)."""
    key = (type_url, kind, must_respond)
    found = _outcomes.get(key)
    if found is None:
        found = RequestOutcome(type_url, kind, must_respond)
        if len(_outcomes) < 256:
            _outcomes[key] = found
    return found


@dataclass(frozen=True, slots=True)
class TypeStatus:
    """One row of syncz for one type on one stream."""

    type_url: str
    status: SyncStatus
    sent_version: str
    sent_nonce: str
    acked_nonce: str
    last_nack: str
    resource_count: int


# Make-before-break: clusters and endpoints first, then listeners and routes that use them;
# types outside this list (NDS, ProxyConfig, ...) come after in name order.
PUSH_ORDER: tuple[str, ...] = (
    typeurls.CLUSTER,
    typeurls.ENDPOINT,
    typeurls.LISTENER,
    typeurls.ROUTE,
    typeurls.SECRET,
)


_RANK = {t: i for i, t in enumerate(PUSH_ORDER)}


def _rank(type_url: str) -> tuple[int, str]:
    return (_RANK.get(type_url, len(PUSH_ORDER)), type_url)


def ordered(type_urls: Iterable[str]) -> list[str]:
    # Called for every stream on every push, most of which carry one type (EDS).
    return sorted(type_urls, key=_rank)


class CountStrings:
    """Decimal strings of counts, shared by every stream that reaches the same count.

    Streams count alike (nonces, delta version numbers), so thousands of them hold the same
    few strings at a time: one copy of each instead of one per stream. `sys.intern` did this
    before, but its table belongs to the interpreter: it grows with every distinct count
    alive at once and never shrinks, and each growth was a step of a megabyte or two in the
    soak's RSS. This table is direct-mapped and fixed in size: count n lives in slot
    n % slots until a count that maps to the same slot takes it, so at most `slots` strings
    are held here, and streams that drift apart just stop sharing."""

    __slots__ = ("_counts", "_mask", "_strings")

    def __init__(self, slots: int = 1024) -> None:
        if slots <= 0 or slots & (slots - 1):
            raise ValueError(f"slots must be a power of two, not {slots}")
        self._mask = slots - 1
        # Filled from the start, with the counts 0 to slots-1: streams reach count n after
        # about n pushes, and a table filled as they went grew until slots pushes in (eight
        # and a half minutes at the soak's two a second). A later count's string takes the
        # place of one of these and is no bigger (up to seven digits: the same allocator
        # size class). The counts are machine integers, not int objects that a later count
        # would replace with bigger ones.
        self._counts = array.array("q", range(slots))
        self._strings: list[str] = [str(n) for n in range(slots)]

    def get(self, n: int) -> str:
        i = n & self._mask
        if self._counts[i] == n:
            return self._strings[i]
        s = str(n)
        self._counts[i] = n
        self._strings[i] = s
        return s

    def held(self) -> int:
        """How many strings the table holds now (for tests)."""
        return sum(1 for c in self._counts if c >= 0)


# One table for the process: every stream's counts look alike whatever its kind.
COUNT_STRINGS = CountStrings()


class NonceSource:
    """Nonces unique within a stream (a counter; the stream id keeps them unique in logs)."""

    __slots__ = ("_n", "_prefix")

    def __init__(self, prefix: str = "") -> None:
        self._prefix = prefix
        self._n = 0

    def next(self) -> str:
        self._n += 1
        if self._prefix:
            return f"{self._prefix}{self._n}"
        return COUNT_STRINGS.get(self._n)


class TypeSync(Protocol):
    """What a stream's per-type state shows of its sync (both stream kinds keep these)."""

    @property
    def sent_version(self) -> str: ...
    @property
    def sent_nonce(self) -> str: ...
    @property
    def acked_nonce(self) -> str: ...
    @property
    def nack_message(self) -> str: ...
    @property
    def nacked_nonce(self) -> str: ...

    def status(self) -> SyncStatus: ...

    def resource_count(self) -> int: ...


def nack_stands(st: TypeSync) -> bool:
    """Whether the client NACKed the last response of the type (SyncStatus.ERROR once sent)."""
    return bool(st.nack_message) and st.nacked_nonce == st.sent_nonce


def sync_status(st: TypeSync, sent: bool, acked: bool) -> SyncStatus:
    """A type's syncz status, worst first: never sent, the last response NACKed, the last
    response ACKed or not yet answered. `sent`/`acked` are the stream kind's own tests."""
    if not sent:
        return SyncStatus.NOT_SENT
    if nack_stands(st):
        return SyncStatus.ERROR
    return SyncStatus.SYNCED if acked else SyncStatus.STALE


_T = TypeVar("_T", bound=TypeSync)


class StreamRules(Generic[_T]):
    """What the SotW and delta stream state machines share: the per-type states, the nonce
    source, request/ACK/NACK counters, and the syncz view of the types."""

    __slots__ = ("_nonces", "_types", "acks", "nacks", "requests", "stream_id")

    def __init__(self, stream_id: str = "") -> None:
        self.stream_id = stream_id
        self._types: dict[str, _T] = {}
        self._nonces = NonceSource()
        self.requests = 0
        self.acks = 0
        self.nacks = 0

    @property
    def subscribed_types(self) -> list[str]:
        return list(self._types)

    def subscribed_among(self, type_urls: frozenset[str] | None) -> set[str]:
        """The types of `type_urls` (None: every type) this stream subscribes to; a new set."""
        return set(self._types) if type_urls is None else self._types.keys() & type_urls

    def in_sync(self) -> bool:
        """Whether every type the stream subscribed to was sent and ACKed."""
        return all(st.status() is SyncStatus.SYNCED for st in self._types.values())

    def status(self) -> list[TypeStatus]:
        return [
            TypeStatus(
                type_url=t,
                status=st.status(),
                sent_version=st.sent_version,
                sent_nonce=st.sent_nonce,
                acked_nonce=st.acked_nonce,
                last_nack=st.nack_message,
                resource_count=st.resource_count(),
            )
            for t, st in self._types.items()
        ]
