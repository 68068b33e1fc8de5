"""The IPv6 half of the capture rules (ip6tables), without root: the IPv4 rules mirrored with
::1 for loopback, and only the IPv6 members of the CIDR and resolver lists; dual-stack
detection from /proc/net/if_inet6."""

from __future__ import annotations

from pathlib import Path

from agent.capture.iptables import has_ipv6_address
from agent.capture.rules import (
    CaptureSettings,
    NatState,
    apply_script,
    chain_rules,
    installed_rules,
    nameservers,
    parse_cidrs,
)


def test_ipv6_mirrors_ipv4() -> None:
    v4 = chain_rules(CaptureSettings())
    v6 = chain_rules(CaptureSettings(), 6)
    assert "-A PILOTFISH_OUTPUT -d ::1/128 -j RETURN" in v6
    assert [r.replace("127.0.0.1/32", "::1/128") for r in v4] == list(v6)


def test_ranges_and_resolvers_split_by_family() -> None:
    s = CaptureSettings(
        include_outbound_ip_ranges=parse_cidrs("10.0.0.0/8,fd00:10::/64", "x"),
        exclude_outbound_ip_ranges=parse_cidrs("10.1.0.0/16,fd00:10::5", "x"),
        capture_dns=True,
        dns_servers=nameservers(["10.0.0.10", "fd00::a", "fe80::1%eth0", "junk"]),
    )
    v4, v6 = chain_rules(s), chain_rules(s, 6)
    assert "-A PILOTFISH_OUTPUT -d 10.0.0.0/8 -j PILOTFISH_REDIRECT" in v4
    assert not any("fd00" in r for r in v4)
    assert "-A PILOTFISH_OUTPUT -d fd00:10::/64 -j PILOTFISH_REDIRECT" in v6
    assert "-A PILOTFISH_OUTPUT -d fd00:10::5/128 -j RETURN" in v6
    # Each family's resolvers to the agent (127.0.0.1 or ::1, where REDIRECT delivers).
    dns = "-p udp -m udp --dport 53 -j REDIRECT --to-ports 15053"
    assert f"-A PILOTFISH_OUTPUT -d 10.0.0.10/32 {dns}" in v4
    assert f"-A PILOTFISH_OUTPUT -d fd00::a/128 {dns}" in v6
    assert not any("fd00::a" in r for r in v4)
    assert "-A PILOTFISH_OUTPUT -p udp -j RETURN" in v6
    assert not any("10.0.0" in r or "10.1.0" in r for r in v6)
    # Only IPv4 ranges included: no IPv6 outbound is captured (Istio's meaning).
    only4 = CaptureSettings(include_outbound_ip_ranges=("10.0.0.0/8",))
    assert not any(
        "PILOTFISH_REDIRECT" in r for r in chain_rules(only4, 6) if "-A PILOTFISH_OUTPUT" in r
    )
    assert nameservers(["fe80::1%eth0"]) == ()


def test_scripts_per_family() -> None:
    script = apply_script(CaptureSettings(), NatState(), 6)
    assert "-A PILOTFISH_OUTPUT -d ::1/128 -j RETURN" in script.splitlines()
    assert installed_rules(CaptureSettings(), 6)[:4] == installed_rules(CaptureSettings())[:4]


def test_dual_stack_detection(tmp_path: Path) -> None:
    f = tmp_path / "if_inet6"
    f.write_text(
        "00000000000000000000000000000001 01 80 10 80       lo\n"
        "fe800000000000000000000000000001 02 40 20 80     eth0\n"
    )
    assert not has_ipv6_address(str(f))  # loopback and link-local only
    f.write_text(f.read_text() + "fd000000000000000000000000000010 02 40 00 80     eth0\n")
    assert has_ipv6_address(str(f))
    assert not has_ipv6_address(str(tmp_path / "missing"))  # IPv6 disabled
