"""DNS messages in, decisions out (sans-IO): answer from the name table, forward, or drop.

The servers hand every packet to `Responder.handle()` and act on the result: bytes to send
back, a `Forward` to pass to the upstream resolvers, or None (drop). Nothing here touches a
socket or a clock.

Hot path: a query that the table answers is encoded once (with dnslib, agent/dns/answers.py)
and the answer is kept keyed by the query's bytes after the id, per table version; the next
identical query (any id) costs one dict probe and one concatenation. Only table answers are
kept, never forwarded ones.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from agent.dns.table import LookupTable

logger = logging.getLogger(__name__)

_RCODE_FORMERR: Final = 1
_RCODE_SERVFAIL: Final = 2
_RCODE_NOTIMP: Final = 4
_CLASS_IN: Final = 1
_QTYPE_A: Final = 1
_QTYPE_AAAA: Final = 28
_CACHE_LIMIT: Final = 10_000


@dataclass(frozen=True, slots=True, eq=False)
class Forward:
    """Not ours: send `query` upstream over the same transport and relay the answer."""

    query: bytes


class Responder:
    """Decides the answer to each query. `table` is swapped by the NameTable handler."""

    def __init__(self) -> None:
        self._table: LookupTable | None = None
        # (transport, query bytes after the id) -> answer bytes after the id.
        self._answers: dict[bytes, bytes] = {}
        self.cache_hits = 0

    @property
    def table(self) -> LookupTable | None:
        return self._table

    @table.setter
    def table(self, table: LookupTable) -> None:
        self._table = table
        self._answers = {}  # answers of the old table must not outlive it

    def handle(self, data: bytes, *, tcp: bool) -> bytes | Forward | None:
        """The reply to one DNS message, a Forward, or None to drop it silently."""
        key = (b"T" if tcp else b"U") + data[2:]
        cached = self._answers.get(key)
        if cached is not None:
            self.cache_hits += 1
            return data[:2] + cached
        return self._slow(data, key, tcp)

    def _slow(self, data: bytes, key: bytes, tcp: bool) -> bytes | Forward | None:
        if len(data) < 12 or data[2] & 0x80:
            return None  # too short to carry an id, or a response: nothing to answer
        opcode = (data[2] >> 3) & 0xF
        if opcode != 0:
            return _error(data, _RCODE_NOTIMP)
        # dnslib's part: imported by the DNS server before it hands over its first query
        # (agent/dns/server.py), here when the responder is used on its own.
        from agent.dns import answers

        try:
            query = answers.parse(data)
        except answers.MALFORMED as e:
            logger.debug("malformed query: %s", e)
            return _error(data, _RCODE_FORMERR)
        if len(query.questions) != 1 or query.rr or query.auth:
            return _error(data, _RCODE_FORMERR)
        table = self._table
        if table is None:
            return _error(
                data, _RCODE_SERVFAIL, echo=True
            )  # no name table yet: cannot say "not ours"
        question = query.q
        if question.qclass != _CLASS_IN or question.qtype not in (_QTYPE_A, _QTYPE_AAAA):
            return Forward(data)
        match = table.lookup(str(question.qname))
        if match is None:
            return Forward(data)
        out = answers.encode(query, match, tcp=tcp)
        if len(self._answers) >= _CACHE_LIMIT:
            self._answers.clear()  # bounded: a scan of random names must not grow it forever
        self._answers[key] = out[2:]
        return out

    def servfail(self, query: bytes, *, echo: bool = True) -> bytes | None:
        """The SERVFAIL reply for a query the upstream did not answer. `echo` repeats its
        question, which only a query that parsed (every forwarded one) can be trusted with."""
        return _error(query, _RCODE_SERVFAIL, echo=echo) if len(query) >= 12 else None


def _error(data: bytes, rcode: int, *, echo: bool = False) -> bytes:
    """A reply carrying only `rcode`: same id, opcode and RD as the query, QR and RA set.
    With `echo` (the query parsed) its single question is repeated: stub resolvers such as
    glibc's drop a SERVFAIL whose question does not match theirs. A malformed query gets the
    bare header (FORMERR), since its question cannot be trusted to be well formed."""
    flags_hi = 0x80 | (data[2] & 0x79)  # QR, opcode, RD
    end = _question_end(data) if echo else None
    if end is None:
        return data[:2] + bytes((flags_hi, 0x80 | rcode)) + b"\x00" * 8
    return data[:2] + bytes((flags_hi, 0x80 | rcode)) + b"\x00\x01" + b"\x00" * 6 + data[12:end]


def _question_end(data: bytes) -> int | None:
    """Where the single question of `data` ends, or None when there is not exactly one
    uncompressed, well-formed question."""
    if data[4:6] != b"\x00\x01":
        return None
    i = 12
    while i < len(data):
        n = data[i]
        if n == 0:
            end = i + 5
            return end if end <= len(data) and end - 12 <= 259 else None
        if n > 63:
            return None
        i += n + 1
    return None
