"""DNS messages in, decisions out (sans-IO): answer from the name table, forward, or drop.

The servers hand every packet to `Responder.handle()` and act on the result: bytes to send
back, a `Forward` to pass to the upstream resolvers, or None (drop). Nothing here touches a
socket or a clock.

Hot path: a query that the table answers is encoded once (with dnslib) and the answer is kept
keyed by the query's bytes after the id, per table version; the next identical query (any id)
costs one dict probe and one concatenation. Only table answers are kept, never forwarded ones.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from dnslib import AAAA, CNAME, EDNS0, QTYPE, RR, A, DNSError, DNSHeader, DNSQuestion, DNSRecord

from agent.dns.table import TTL, LookupTable

logger = logging.getLogger(__name__)

_RCODE_FORMERR: Final = 1
_RCODE_SERVFAIL: Final = 2
_RCODE_NOTIMP: Final = 4
_CLASS_IN: Final = 1
_QTYPE_A: Final = 1
_QTYPE_AAAA: Final = 28
_QTYPE_OPT: Final = 41
# Classic DNS over UDP; EDNS lets a client ask for more (RFC 6891).
UDP_DEFAULT_SIZE: Final = 512
# What we advertise and the most we send over UDP whatever the client claims (the
# fragmentation-safe size of DNS Flag Day 2020).
UDP_MAX_SIZE: Final = 1232
_CACHE_LIMIT: Final = 10_000


@dataclass(frozen=True, slots=True)
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
        try:
            query = DNSRecord.parse(data)
        except (DNSError, ValueError, IndexError, UnicodeError) as e:
            logger.debug("malformed query: %s", e)
            return _error(data, _RCODE_FORMERR)
        if len(query.questions) != 1 or query.rr or query.auth:
            return _error(data, _RCODE_FORMERR)
        table = self._table
        if table is None:
            return _error(
                data, _RCODE_SERVFAIL, echo=True
            )  # no name table yet: cannot say "not ours"
        question: DNSQuestion = query.q
        if question.qclass != _CLASS_IN or question.qtype not in (_QTYPE_A, _QTYPE_AAAA):
            return Forward(data)
        match = table.lookup(str(question.qname))
        if match is None:
            return Forward(data)
        entry = match.entry
        reply = DNSRecord(
            DNSHeader(id=query.header.id, qr=1, aa=1, ra=1, rd=query.header.rd),
            q=question,
        )
        owner = question.qname
        if match.cname:
            reply.add_answer(RR(owner, QTYPE.CNAME, ttl=TTL, rdata=CNAME(entry.name + ".")))
            owner = entry.name + "."
        if question.qtype == _QTYPE_A:
            for ip in entry.ipv4:
                reply.add_answer(RR(owner, QTYPE.A, ttl=TTL, rdata=A(ip)))
        else:
            for ip in entry.ipv6:
                reply.add_answer(RR(owner, QTYPE.AAAA, ttl=TTL, rdata=AAAA(ip)))
        # A known name without addresses of the asked family is NOERROR with no answers:
        # NXDOMAIN would tell the client the name does not exist at all (curl then gives up
        # instead of using the other family).
        edns = _edns_size(query)
        if edns is not None:
            reply.add_ar(EDNS0(udp_len=UDP_MAX_SIZE))
        out = bytes(reply.pack())
        if not tcp:
            limit = UDP_DEFAULT_SIZE if edns is None else min(max(edns, 512), UDP_MAX_SIZE)
            if len(out) > limit:
                out = _truncated(reply)
        if len(self._answers) >= _CACHE_LIMIT:
            self._answers.clear()  # bounded: a scan of random names must not grow it forever
        self._answers[key] = out[2:]
        return out

    def servfail(self, query: bytes, *, echo: bool = True) -> bytes | None:
        """The SERVFAIL reply for a query the upstream did not answer. `echo` repeats its
        question, which only a query that parsed (every forwarded one) can be trusted with."""
        return _error(query, _RCODE_SERVFAIL, echo=echo) if len(query) >= 12 else None


def _edns_size(query: DNSRecord) -> int | None:
    for rr in query.ar:
        if rr.rtype == _QTYPE_OPT:
            return int(rr.rclass)
    return None


def _truncated(reply: DNSRecord) -> bytes:
    """The question alone with TC set: the client retries over TCP (RFC 2181 section 9)."""
    short = DNSRecord(
        DNSHeader(id=reply.header.id, qr=1, aa=1, ra=1, rd=reply.header.rd, tc=1), q=reply.q
    )
    for rr in reply.ar:
        short.add_ar(rr)
    data = bytes(short.pack())
    return data


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
