"""The capture rules as data: what each setting turns into, the scripts that apply and remove
them, and reading back an iptables-save dump (no root needed)."""

from __future__ import annotations

import pytest

from agent.capture.rules import (
    ALL,
    CHAINS,
    CaptureSettings,
    CaptureSettingsError,
    NatState,
    apply_script,
    chain_rules,
    cleanup_script,
    installed_rules,
    ipv4_servers,
    jump_rules,
    parse_cidrs,
    parse_include_ports,
    parse_ports,
    parse_save,
)
from tests.support.iptables import nat_lines


def test_defaults_capture_all_tcp_and_exclude_the_proxy() -> None:
    rules = chain_rules(CaptureSettings())
    assert "-A PILOTFISH_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006" in rules
    assert "-A PILOTFISH_REDIRECT -p tcp -j REDIRECT --to-ports 15001" in rules
    out = [r for r in rules if r.startswith("-A PILOTFISH_OUTPUT")]
    # The proxy's own traffic returns before anything can redirect it (no loops).
    assert out[:2] == [
        "-A PILOTFISH_OUTPUT -m owner --uid-owner 1337 -j RETURN",
        "-A PILOTFISH_OUTPUT -m owner --gid-owner 1337 -j RETURN",
    ]
    assert out[-1] == "-A PILOTFISH_OUTPUT -j PILOTFISH_REDIRECT"
    assert "-A PILOTFISH_OUTPUT -d 127.0.0.1/32 -j RETURN" in out
    # Status and admin ports stay reachable from outside.
    for port in (15000, 15020, 15021, 15090):
        assert f"-A PILOTFISH_INBOUND -p tcp -m tcp --dport {port} -j RETURN" in rules
    assert jump_rules(CaptureSettings()) == (
        "-A PREROUTING -p tcp -j PILOTFISH_INBOUND",
        "-A OUTPUT -p tcp -j PILOTFISH_OUTPUT",
    )
    assert not any("udp" in r for r in rules)


def test_include_and_exclude_lists() -> None:
    s = CaptureSettings(
        include_outbound_ip_ranges=("10.0.0.0/8", "192.168.1.1/32"),
        exclude_outbound_ip_ranges=("10.1.0.0/16",),
        include_inbound_ports=("9080", "8080"),
        exclude_inbound_ports=(15020,),
        exclude_outbound_ports=(22,),
        proxy_uids=(1337, 0),
        proxy_gids=(),
    )
    rules = chain_rules(s)
    out = [r for r in rules if r.startswith("-A PILOTFISH_OUTPUT")]
    assert out == [
        "-A PILOTFISH_OUTPUT -m owner --uid-owner 1337 -j RETURN",
        "-A PILOTFISH_OUTPUT -m owner --uid-owner 0 -j RETURN",
        "-A PILOTFISH_OUTPUT -d 127.0.0.1/32 -j RETURN",
        "-A PILOTFISH_OUTPUT -p tcp -m tcp --dport 22 -j RETURN",
        "-A PILOTFISH_OUTPUT -d 10.1.0.0/16 -j RETURN",
        "-A PILOTFISH_OUTPUT -d 10.0.0.0/8 -j PILOTFISH_REDIRECT",
        "-A PILOTFISH_OUTPUT -d 192.168.1.1/32 -j PILOTFISH_REDIRECT",
    ]
    inbound = [r for r in rules if r.startswith("-A PILOTFISH_INBOUND")]
    assert inbound == [
        "-A PILOTFISH_INBOUND -p tcp -m tcp --dport 15020 -j RETURN",
        "-A PILOTFISH_INBOUND -p tcp -m tcp --dport 9080 -j PILOTFISH_IN_REDIRECT",
        "-A PILOTFISH_INBOUND -p tcp -m tcp --dport 8080 -j PILOTFISH_IN_REDIRECT",
    ]


def test_empty_include_lists_capture_nothing() -> None:
    rules = chain_rules(CaptureSettings(include_outbound_ip_ranges=(), include_inbound_ports=()))
    assert not any("-j PILOTFISH_REDIRECT" in r for r in rules)
    assert not any("-j PILOTFISH_IN_REDIRECT" in r for r in rules)


def test_dns_capture_only_to_resolvers_and_after_the_proxy_exclusion() -> None:
    s = CaptureSettings(capture_dns=True, dns_servers=("10.96.0.10", "127.0.0.53"))
    rules = chain_rules(s)
    out = [r for r in rules if r.startswith("-A PILOTFISH_OUTPUT")]
    redirect = "-j REDIRECT --to-ports 15053"
    assert out[2:7] == [
        f"-A PILOTFISH_OUTPUT -d 10.96.0.10/32 -p udp -m udp --dport 53 {redirect}",
        f"-A PILOTFISH_OUTPUT -d 10.96.0.10/32 -p tcp -m tcp --dport 53 {redirect}",
        f"-A PILOTFISH_OUTPUT -d 127.0.0.53/32 -p udp -m udp --dport 53 {redirect}",
        f"-A PILOTFISH_OUTPUT -d 127.0.0.53/32 -p tcp -m tcp --dport 53 {redirect}",
        "-A PILOTFISH_OUTPUT -p udp -j RETURN",
    ]
    assert "-A OUTPUT -p udp -j PILOTFISH_OUTPUT" in jump_rules(s)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("", ()),
        ("*", (ALL,)),
        ("10.0.0.1", ("10.0.0.1/32",)),
        ("10.1.2.3/8, 10.0.0.0/8", ("10.0.0.0/8",)),
    ],
)
def test_parse_cidrs(text: str, want: tuple[str, ...]) -> None:
    assert parse_cidrs(text, "x", allow_all=True) == want


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: parse_cidrs("*", "--exclude"), "'*' is not allowed"),
        (lambda: parse_cidrs("*,10.0.0.0/8", "--inc", allow_all=True), "cannot be combined"),
        (lambda: parse_cidrs("nope", "--inc"), "'nope' is not an IP range"),
        (lambda: parse_ports("80,http", "--ports"), "'http' is not a port number"),
        (lambda: parse_ports("70000", "--ports"), "is not a port number"),
        (lambda: parse_include_ports("*,80", "--ports"), "cannot be combined"),
    ],
)
def test_bad_values_are_clear_errors(call: object, message: str) -> None:
    with pytest.raises(CaptureSettingsError, match=message):
        call()  # type: ignore[operator]


def test_ports_and_servers() -> None:
    assert parse_ports("80, 443,80", "p") == (80, 443)
    assert parse_include_ports("*", "p") == (ALL,)
    assert parse_include_ports("9080,8080", "p") == ("9080", "8080")
    assert ipv4_servers(["10.0.0.1", "fe80::1", "junk", "10.0.0.1"]) == ("10.0.0.1",)


SAVED = """\
# Generated by iptables-save v1.8.9 (nf_tables)
*filter
:INPUT ACCEPT [3:120]
-A INPUT -j PILOTFISH_NOT_NAT
COMMIT
*nat
:PREROUTING ACCEPT [10:600]
:OUTPUT ACCEPT [0:0]
:PILOTFISH_INBOUND - [0:0]
:PILOTFISH_OUTPUT - [0:0]
:PILOTFISH_OLD - [0:0]
:OTHER - [0:0]
-A PREROUTING -p tcp -j PILOTFISH_INBOUND
-A PREROUTING -p tcp -j OTHER
-A OUTPUT -p tcp -j PILOTFISH_OUTPUT
-A PILOTFISH_OUTPUT -j PILOTFISH_REDIRECT
COMMIT
"""


def test_parse_save_finds_only_ours_in_nat() -> None:
    state = parse_save(SAVED)
    assert state.chains == ("PILOTFISH_INBOUND", "PILOTFISH_OUTPUT", "PILOTFISH_OLD")
    assert state.jumps == (
        "-A PREROUTING -p tcp -j PILOTFISH_INBOUND",
        "-A OUTPUT -p tcp -j PILOTFISH_OUTPUT",
    )
    assert parse_save("*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n").empty


def test_cleanup_script_removes_exactly_ours() -> None:
    script = cleanup_script(parse_save(SAVED))
    assert script == (
        "*nat\n"
        "-D PREROUTING -p tcp -j PILOTFISH_INBOUND\n"
        "-D OUTPUT -p tcp -j PILOTFISH_OUTPUT\n"
        "-F PILOTFISH_INBOUND\n-F PILOTFISH_OUTPUT\n-F PILOTFISH_OLD\n"
        "-X PILOTFISH_INBOUND\n-X PILOTFISH_OUTPUT\n-X PILOTFISH_OLD\n"
        "COMMIT\n"
    )
    assert cleanup_script(NatState()) is None


def test_apply_script_replaces_an_earlier_install() -> None:
    s = CaptureSettings()
    script = apply_script(s, parse_save(SAVED)).splitlines()
    assert script[0] == "*nat" and script[-1] == "COMMIT"
    # Old jumps out (else they would be doubled), a chain we no longer use removed, ours
    # declared (which flushes them), then the rules.
    assert script[1:3] == [
        "-D PREROUTING -p tcp -j PILOTFISH_INBOUND",
        "-D OUTPUT -p tcp -j PILOTFISH_OUTPUT",
    ]
    assert script[3:5] == ["-F PILOTFISH_OLD", "-X PILOTFISH_OLD"]
    assert script[5:-1] == list(installed_rules(s))
    fresh = apply_script(s, NatState()).splitlines()
    assert fresh[1:-1] == list(installed_rules(s))
    assert [ln[1:].split()[0] for ln in installed_rules(s) if ln.startswith(":")] == list(CHAINS)


def test_nat_lines_zeroes_counters() -> None:
    lines = nat_lines(SAVED)
    assert lines[0] == ":PREROUTING ACCEPT [0:0]"
    assert "-A INPUT -j PILOTFISH_NOT_NAT" not in lines
