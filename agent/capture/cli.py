"""`pilotfish-agent iptables`: set up (or remove) traffic capture in the current network
namespace, as Istio's `istio-iptables` init container does. Flags are named after Istio's
pod annotations (`traffic.sidecar.istio.io/includeOutboundIPRanges` becomes
`--include-outbound-ip-ranges`) and take the same values."""

from __future__ import annotations

import argparse
import os
import sys

from agent.capture.iptables import CaptureError, Iptables, find_tool, has_ipv6_address
from agent.capture.rules import (
    DEFAULT_EXCLUDED_INBOUND,
    CaptureSettings,
    CaptureSettingsError,
    installed_rules,
    nameservers,
    parse_cidrs,
    parse_include_ports,
    parse_ports,
)
from agent.config import resolv_conf_servers
from pilotfish_common import logsetup


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="pilotfish-agent iptables",
        description=(
            "Redirect this network namespace's TCP traffic into Envoy (interception mode "
            "REDIRECT): outbound to the virtualOutbound port, inbound to the virtualInbound "
            "port, the proxy's own UID/GID excluded. Rules live in PILOTFISH_* chains of the "
            "nat table; applying again replaces them, --cleanup removes exactly them."
        ),
    )
    p.add_argument("--dry-run", action="store_true", help="print the rules, change nothing")
    p.add_argument("--cleanup", action="store_true", help="remove the rules this command added")
    p.add_argument("--outbound-port", type=int, default=15001, help="virtualOutbound port")
    p.add_argument("--inbound-port", type=int, default=15006, help="virtualInbound port")
    p.add_argument(
        "--proxy-uid", default="1337", help="UIDs whose traffic is not captured (default 1337)"
    )
    p.add_argument(
        "--proxy-gid", default="1337", help="GIDs whose traffic is not captured (default 1337)"
    )
    p.add_argument(
        "--include-outbound-ip-ranges",
        default="*",
        metavar="CIDRS",
        help="outbound destinations to capture: '*' or CIDRs (empty: none)",
    )
    p.add_argument("--exclude-outbound-ip-ranges", default="", metavar="CIDRS")
    p.add_argument(
        "--include-inbound-ports",
        default="*",
        metavar="PORTS",
        help="inbound ports to capture: '*' or ports (empty: none)",
    )
    p.add_argument(
        "--exclude-inbound-ports",
        default=",".join(map(str, DEFAULT_EXCLUDED_INBOUND)),
        metavar="PORTS",
        help="inbound ports never captured (default %(default)s)",
    )
    p.add_argument("--exclude-outbound-ports", default="", metavar="PORTS")
    p.add_argument(
        "--capture-dns",
        action="store_true",
        default=env("ISTIO_META_DNS_CAPTURE", "").lower() == "true",
        help="send DNS (UDP/TCP 53 to the resolv.conf servers) to the agent "
        "(env ISTIO_META_DNS_CAPTURE=true)",
    )
    p.add_argument("--dns-port", type=int, default=15053, help="the agent's DNS port")
    p.add_argument(
        "--dns-servers",
        default=None,
        metavar="IPS",
        help="resolvers whose traffic is captured (default: /etc/resolv.conf's)",
    )
    p.add_argument(
        "--ipv6",
        choices=("auto", "on", "off"),
        default="auto",
        help="also install the rules for IPv6 (ip6tables): auto when the pod has an IPv6 "
        "address of global scope (a dual-stack pod; default %(default)s)",
    )
    logsetup.add_arguments(p)
    return p


def _ids(text: str, what: str) -> tuple[int, ...]:
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if not part.isdigit():
            raise CaptureSettingsError(f"{what}: {part!r} is not a numeric id")
        out.append(int(part))
    return tuple(out)


def settings_from_args(args: argparse.Namespace) -> CaptureSettings:
    for name in ("outbound_port", "inbound_port", "dns_port"):
        value = getattr(args, name)
        if not 0 < value < 65536:
            raise CaptureSettingsError(f"--{name.replace('_', '-')}: {value} is not a port")
    servers = (
        tuple(s.strip() for s in args.dns_servers.split(",") if s.strip())
        if args.dns_servers is not None
        else resolv_conf_servers()
    )
    if args.capture_dns and args.dns_servers is not None:
        # Given explicitly: a typo must not silently capture nothing.
        parse_cidrs(args.dns_servers, "--dns-servers")
    return CaptureSettings(
        outbound_port=args.outbound_port,
        inbound_port=args.inbound_port,
        proxy_uids=_ids(args.proxy_uid, "--proxy-uid"),
        proxy_gids=_ids(args.proxy_gid, "--proxy-gid"),
        include_outbound_ip_ranges=parse_cidrs(
            args.include_outbound_ip_ranges, "--include-outbound-ip-ranges", allow_all=True
        ),
        exclude_outbound_ip_ranges=parse_cidrs(
            args.exclude_outbound_ip_ranges, "--exclude-outbound-ip-ranges"
        ),
        include_inbound_ports=parse_include_ports(
            args.include_inbound_ports, "--include-inbound-ports"
        ),
        exclude_inbound_ports=parse_ports(args.exclude_inbound_ports, "--exclude-inbound-ports"),
        exclude_outbound_ports=parse_ports(args.exclude_outbound_ports, "--exclude-outbound-ports"),
        capture_dns=args.capture_dns,
        dns_port=args.dns_port,
        dns_servers=nameservers(servers) if args.capture_dns else (),
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.dry_run and args.cleanup:
        print(
            "pilotfish-agent iptables: --dry-run and --cleanup exclude each other", file=sys.stderr
        )
        return 2
    try:
        settings = settings_from_args(args) if not args.cleanup else CaptureSettings()
    except CaptureSettingsError as e:
        print(f"pilotfish-agent iptables: {e}", file=sys.stderr)
        return 2
    families = (4, 6) if _ipv6(args.ipv6) else (4,)
    if args.dry_run:
        # One iptables-restore script per family, IPv6's after a comment line naming it.
        for family in families:
            if family == 6:
                print("# ip6tables")
            print("*nat")
            for line in installed_rules(settings, family):
                print(line)
            print("COMMIT")
        return 0
    if settings.capture_dns and not settings.dns_servers:
        print(
            "pilotfish-agent iptables: --capture-dns: no nameserver in /etc/resolv.conf "
            "(give --dns-servers)",
            file=sys.stderr,
        )
        return 2
    try:
        if args.cleanup:
            # Both families whenever IPv6 is there: what an earlier install added may be
            # IPv6 rules in a pod that has since lost its address.
            cleanup = (4, 6) if args.ipv6 != "off" and _ipv6_tables() else (4,)
            removed = [Iptables(family=f).cleanup() for f in cleanup]
            print("capture rules removed" if any(removed) else "no capture rules to remove")
        else:
            for family in families:
                Iptables(family=family).apply(settings)
            print("capture rules installed" + (" (IPv4 and IPv6)" if 6 in families else ""))
    except CaptureError as e:
        print(f"pilotfish-agent iptables: {e}", file=sys.stderr)
        return 1
    return 0


def _ipv6(mode: str) -> bool:
    return mode == "on" or (mode == "auto" and has_ipv6_address())


def _ipv6_tables() -> bool:
    """IPv6 enabled in this kernel (its address list exists) and ip6tables installed."""
    if not os.path.exists("/proc/net/if_inet6"):
        return False
    try:
        find_tool("ip6tables-save")
    except CaptureError:
        return False
    return True
