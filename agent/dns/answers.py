"""dnslib's part of the responder (agent/dns/responder.py): parsing a query and encoding a
table answer.

A module of its own because dnslib costs ~2.5 ms of CPU to import and the agent answers no
query before it is ready: the DNS server binds its sockets with the agent's start and
imports this module in a thread with its first query (agent/dns/server.py, `load_answers`).
"""

from __future__ import annotations

from typing import Final

from dnslib import AAAA, CNAME, EDNS0, QTYPE, RR, A, DNSError, DNSHeader, DNSRecord

from agent.dns.table import TTL, Match

# What dnslib raises for a message it cannot parse.
MALFORMED: Final = (DNSError, ValueError, IndexError, UnicodeError)

_QTYPE_A: Final = 1
_QTYPE_OPT: Final = 41
# Classic DNS over UDP; EDNS lets a client ask for more (RFC 6891).
UDP_DEFAULT_SIZE: Final = 512
# What we advertise and the most we send over UDP whatever the client claims (the
# fragmentation-safe size of DNS Flag Day 2020).
UDP_MAX_SIZE: Final = 1232


def parse(data: bytes) -> DNSRecord:
    """The query in `data`; one of MALFORMED when it is not one."""
    return DNSRecord.parse(data)


def encode(query: DNSRecord, match: Match, *, tcp: bool) -> bytes:
    """The answer to `query` (one A or AAAA question of class IN) from the table's `match`."""
    question = query.q
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
    return out


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
