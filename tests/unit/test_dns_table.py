"""The agent's DNS logic without sockets: name table lookups (agent/dns/table.py) and the
answers the responder builds from them (agent/dns/responder.py)."""

from __future__ import annotations

import pytest
from dnslib import EDNS0, QTYPE, RCODE, DNSRecord

from agent.dns.handler import NameTableHandler
from agent.dns.responder import Forward, Responder
from agent.dns.table import LookupTable, NameInfo, NameTableError, kubernetes_search_domains
from protos import nds_pb2

ROWS = {
    "backend.default.svc.cluster.local": NameInfo(
        ("10.0.0.1", "fd00::1"), "Kubernetes", "backend", "default"
    ),
    "db.shop.svc.cluster.local": NameInfo(("10.0.0.2",), "Kubernetes", "db", "shop"),
    "api.example.com": NameInfo(("10.0.0.3",), "External"),
    "*.example.com": NameInfo(("10.0.0.4",), "External"),
    "*.deep.example.com": NameInfo(("10.0.0.5",), "External"),
    "v6only.example.org": NameInfo(("fd00::9",), "External"),
    # A real hostname that an alt name of db would also produce: the real one wins.
    "db.shop": NameInfo(("10.0.0.6",), "External"),
}


def table(rows: dict[str, NameInfo] = ROWS, namespace: str = "default") -> LookupTable:
    return LookupTable.build(
        rows,
        namespace=namespace,
        search_domains=kubernetes_search_domains(namespace, "cluster.local"),
        version=1,
    )


@pytest.mark.parametrize(
    ("name", "host", "cname"),
    [
        ("backend.default.svc.cluster.local", "backend.default.svc.cluster.local", False),
        ("Backend.DEFAULT.svc.Cluster.Local.", "backend.default.svc.cluster.local", False),
        ("backend", "backend.default.svc.cluster.local", False),
        ("backend.default", "backend.default.svc.cluster.local", False),
        ("backend.default.svc", "backend.default.svc.cluster.local", False),
        ("db.shop.svc", "db.shop.svc.cluster.local", False),
        ("db.shop", "db.shop", False),  # the real host, not db's alt name
        ("api.example.com", "api.example.com", False),  # exact before wildcard
        ("www.example.com", "*.example.com", False),
        ("a.b.example.com", "*.example.com", False),
        ("x.deep.example.com", "*.deep.example.com", False),  # the closest wildcard
        ("backend.default.svc.cluster.local.default.svc.cluster.local",
         "backend.default.svc.cluster.local", True),
        ("backend.svc.cluster.local", "backend.default.svc.cluster.local", True),
        ("www.example.com.cluster.local", "*.example.com", True),
    ],
)  # fmt: skip
def test_lookup_rules(name: str, host: str, cname: bool) -> None:
    match = table().lookup(name)
    assert match is not None
    assert (match.entry.name, match.cname) == (host, cname)


@pytest.mark.parametrize(
    "name", ["db", "example.com", "other.test", "backend.other", "svc.cluster.local", ""]
)
def test_names_that_are_not_ours(name: str) -> None:
    assert table().lookup(name) is None


def test_short_name_follows_the_agent_namespace() -> None:
    shop = table(namespace="shop")
    assert shop.lookup("backend") is None
    match = shop.lookup("db")
    assert match is not None and match.entry.name == "db.shop.svc.cluster.local"


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ({"a.test": NameInfo(("10.0.0.300",))}, "'10.0.0.300' is not an IP address"),
        ({"a..test": NameInfo(("10.0.0.1",))}, "not a valid DNS name"),
        ({"a.*.test": NameInfo(("10.0.0.1",))}, "not a valid DNS name"),
        ({"*": NameInfo(("10.0.0.1",))}, "a wildcard needs a domain"),
        ({"A.test": NameInfo(()), "a.test": NameInfo(())}, "appears twice"),
    ],
)
def test_bad_tables_are_rejected(rows: dict[str, NameInfo], message: str) -> None:
    with pytest.raises(NameTableError, match=message.replace("(", r"\(").replace("*", r"\*")):
        table(rows)


def test_handler_builds_and_swaps_tables() -> None:
    seen: list[LookupTable] = []
    handler = NameTableHandler(seen.append, namespace="default")
    nt = nds_pb2.NameTable()
    info = nt.table["backend.default.svc.cluster.local"]
    info.ips.append("10.0.0.1")
    info.registry, info.shortname, info.namespace = "Kubernetes", "backend", "default"
    handler([nt])
    handler([nt])
    assert [t.version for t in seen] == [1, 2]
    assert handler.received.is_set()
    assert handler.ndsz()["alt_names"]["backend.default"] == "backend.default.svc.cluster.local"
    nt.table["bad.test"].ips.append("not-an-ip")
    with pytest.raises(NameTableError):
        handler([nt])
    assert handler.table is seen[-1] and len(seen) == 2  # the last good table stays


# --- responder -------------------------------------------------------------------------------


def responder() -> Responder:
    r = Responder()
    r.table = table()
    return r


def ask(r: Responder, name: str, qtype: str = "A", *, tcp: bool = False, edns: int = 0) -> object:
    q = DNSRecord.question(name, qtype)
    if edns:
        q.add_ar(EDNS0(udp_len=edns))
    out = r.handle(bytes(q.pack()), tcp=tcp)
    if isinstance(out, bytes):
        reply = DNSRecord.parse(out)
        assert reply.header.id == q.header.id and reply.header.qr == 1
        return reply
    return out


def test_answers_a_and_aaaa_authoritatively() -> None:
    r = responder()
    a = ask(r, "backend")
    assert isinstance(a, DNSRecord)
    assert [str(rr.rdata) for rr in a.rr] == ["10.0.0.1"]
    assert a.header.aa == 1 and a.rr[0].ttl == 30
    aaaa = ask(r, "backend", "AAAA")
    assert isinstance(aaaa, DNSRecord)
    assert [str(rr.rdata) for rr in aaaa.rr] == ["fd00::1"]


def test_known_name_without_the_family_is_noerror_empty() -> None:
    r = responder()
    for name, qtype in (("db.shop.svc", "AAAA"), ("v6only.example.org", "A")):
        reply = ask(r, name, qtype)
        assert isinstance(reply, DNSRecord)
        assert reply.header.rcode == RCODE.NOERROR and reply.rr == []


def test_search_suffixed_name_gets_cname_then_address() -> None:
    reply = ask(responder(), "db.shop.svc.cluster.local.default.svc.cluster.local")
    assert isinstance(reply, DNSRecord)
    assert [QTYPE.get(rr.rtype) for rr in reply.rr] == ["CNAME", "A"]
    assert str(reply.rr[0].rdata) == "db.shop.svc.cluster.local."


def test_everything_else_is_forwarded() -> None:
    r = responder()
    assert isinstance(ask(r, "www.google.com"), Forward)
    assert isinstance(ask(r, "backend", "MX"), Forward)  # not A/AAAA: the upstream's business


def test_servfail_before_the_first_table() -> None:
    reply = ask(Responder(), "backend")
    assert isinstance(reply, DNSRecord) and reply.header.rcode == RCODE.SERVFAIL
    assert str(reply.q.qname) == "backend."  # the question is echoed (glibc checks it)


def test_answers_are_cached_per_table_version_and_keep_the_query_id() -> None:
    r = responder()
    first = DNSRecord.question("backend")
    second = DNSRecord.question("backend")
    one = r.handle(bytes(first.pack()), tcp=False)
    two = r.handle(bytes(second.pack()), tcp=False)
    assert isinstance(one, bytes) and isinstance(two, bytes)
    assert r.cache_hits == 1
    assert two[:2] == second.pack()[:2] and two[2:] == one[2:]
    r.table = table(
        {
            "backend.default.svc.cluster.local": NameInfo(
                ("10.9.9.9",), "Kubernetes", "backend", "default"
            )
        }
    )
    three = r.handle(bytes(second.pack()), tcp=False)
    assert isinstance(three, bytes)
    assert [str(rr.rdata) for rr in DNSRecord.parse(three).rr] == ["10.9.9.9"]


def test_udp_truncation_respects_edns_size_and_tcp_never_truncates() -> None:
    r = Responder()
    r.table = table({"big.test": NameInfo(tuple(f"10.1.0.{i}" for i in range(1, 61)))})
    for edns, tc in ((0, 1), (600, 1), (4096, 0)):
        reply = ask(r, "big.test", edns=edns)
        assert isinstance(reply, DNSRecord)
        assert reply.header.tc == tc, edns
        assert len(reply.rr) == (0 if tc else 60)
    tcp = ask(r, "big.test", tcp=True)
    assert isinstance(tcp, DNSRecord) and tcp.header.tc == 0 and len(tcp.rr) == 60


@pytest.mark.parametrize(
    ("packet", "expect"),
    [
        (b"", None),
        (b"\x12\x34\x01", None),  # shorter than a header
        (b"\x12\x34\x81\x80" + b"\x00" * 8, None),  # a response: never answered
        (b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example", RCODE.FORMERR),
        (b"\x12\x34\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00", RCODE.FORMERR),  # no question
        (b"\x12\x34\x11\x00\x00\x00\x00\x00\x00\x00\x00\x00", RCODE.NOTIMP),  # opcode STATUS
    ],
)
def test_malformed_packets(packet: bytes, expect: int | None) -> None:
    out = responder().handle(packet, tcp=False)
    if expect is None:
        assert out is None
        return
    assert isinstance(out, bytes)
    reply = DNSRecord.parse(out)
    assert reply.header.id == 0x1234 and reply.header.qr == 1
    assert reply.header.rcode == expect
