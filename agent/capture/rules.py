"""The capture rules as data: settings in, an `iptables-restore` script out. No I/O here, so
every rule can be tested without root.

The rules follow Istio's `istio-iptables` (same ports, same annotation semantics), in chains of
our own in the `nat` table so that removing them touches nothing else:

- `PREROUTING -p tcp -j PILOTFISH_INBOUND`: inbound TCP, minus excluded ports (the agent's
  status and Envoy's admin ports by default), is redirected to Envoy's virtualInbound (15006).
- `OUTPUT -p tcp -j PILOTFISH_OUTPUT`: outbound TCP is redirected to virtualOutbound (15001),
  except traffic of the proxy's own UID/GID (Envoy runs as 1337, the agent joins GID 1337),
  traffic to 127.0.0.1 and excluded ports/CIDRs. Without the UID/GID exclusion Envoy's own
  upstream connections would come back to it: a loop.
- with DNS capture, `OUTPUT -p udp -j PILOTFISH_OUTPUT` too, and UDP/TCP port 53 to the
  resolv.conf servers goes to the agent's DNS server (15053); other UDP is left alone.

IPv6 (dual stack) mirrors the IPv4 rules in ip6tables' nat table, `family=6` below: the same
chains, ports and exclusions, `::1` in place of 127.0.0.1, and of the CIDR lists only the
IPv6 ones (an include list naming only IPv4 ranges captures no IPv6 outbound traffic, as
Istio's); DNS to IPv6 resolvers goes to the agent on [::1]:15053 (where a REDIRECT in OUTPUT
delivers; the agent listens there in mode REDIRECT).

Rules are written in the exact form `iptables-save` prints them back (`-d` before `-p`,
`-m tcp` spelled out, `/32` on addresses), so `--dry-run` output can be compared with what is
installed line by line.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final

TABLE: Final = "nat"
INBOUND: Final = "PILOTFISH_INBOUND"
IN_REDIRECT: Final = "PILOTFISH_IN_REDIRECT"
OUTPUT: Final = "PILOTFISH_OUTPUT"
REDIRECT: Final = "PILOTFISH_REDIRECT"
# Every chain we create, in creation order; cleanup removes exactly these (and jumps to them).
CHAINS: Final = (INBOUND, IN_REDIRECT, OUTPUT, REDIRECT)
PREFIX: Final = "PILOTFISH_"

# "*" in an include list: everything (Istio's annotation syntax).
ALL: Final = "*"
# Istio excludes its agent's status ports from inbound capture; Envoy's admin (15000) is bound
# at the pod IP here (DESIGN), so it is left reachable too.
DEFAULT_EXCLUDED_INBOUND: Final = (15000, 15020, 15021, 15090)


class CaptureSettingsError(ValueError):
    """A capture setting (port list, CIDR list) cannot be used."""


@dataclass(frozen=True, slots=True)
class CaptureSettings:
    """What to capture. Include lists hold `("*",)` for "everything"; an empty include list
    captures nothing in that direction (Istio's meaning of an empty annotation)."""

    outbound_port: int = 15001
    inbound_port: int = 15006
    proxy_uids: tuple[int, ...] = (1337,)
    proxy_gids: tuple[int, ...] = (1337,)
    include_outbound_ip_ranges: tuple[str, ...] = (ALL,)
    exclude_outbound_ip_ranges: tuple[str, ...] = ()
    include_inbound_ports: tuple[str, ...] = (ALL,)
    exclude_inbound_ports: tuple[int, ...] = DEFAULT_EXCLUDED_INBOUND
    exclude_outbound_ports: tuple[int, ...] = ()
    capture_dns: bool = False
    dns_port: int = 15053
    # Where the pod's resolver sends queries (resolv.conf): those are redirected, nothing else.
    dns_servers: tuple[str, ...] = ()


# --- parsing Istio's annotation values -------------------------------------------------------


def parse_ports(text: str, what: str) -> tuple[int, ...]:
    """`"15020,15021"` → (15020, 15021); empty → ()."""
    out: list[int] = []
    for part in _items(text):
        if not part.isdigit() or not 0 < int(part) < 65536:
            raise CaptureSettingsError(f"{what}: {part!r} is not a port number")
        if int(part) not in out:
            out.append(int(part))
    return tuple(out)


def parse_include_ports(text: str, what: str) -> tuple[str, ...]:
    """`"*"` or a port list; the ports come back as strings next to "*"."""
    items = _items(text)
    if ALL in items:
        if len(items) > 1:
            raise CaptureSettingsError(f"{what}: '*' cannot be combined with ports")
        return (ALL,)
    return tuple(str(p) for p in parse_ports(text, what))


def parse_cidrs(text: str, what: str, *, allow_all: bool = False) -> tuple[str, ...]:
    """IPv4 and IPv6 CIDRs (a bare address is a /32 or /128), normalized as iptables and
    ip6tables print them; `"*"` when `allow_all`."""
    items = _items(text)
    if ALL in items:
        if not allow_all:
            raise CaptureSettingsError(f"{what}: '*' is not allowed here")
        if len(items) > 1:
            raise CaptureSettingsError(f"{what}: '*' cannot be combined with ranges")
        return (ALL,)
    out: list[str] = []
    for part in items:
        try:
            net = ipaddress.ip_network(part, strict=False)
        except ValueError:
            raise CaptureSettingsError(f"{what}: {part!r} is not an IP range") from None
        if str(net) not in out:
            out.append(str(net))
    return tuple(out)


def _items(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def ipv4_servers(servers: Iterable[str]) -> tuple[str, ...]:
    """The IPv4 addresses among resolv.conf's nameservers."""
    return tuple(s for s in nameservers(servers) if ipaddress.ip_address(s).version == 4)


def nameservers(servers: Iterable[str]) -> tuple[str, ...]:
    """The IP addresses among resolv.conf's nameservers, both families (a zone index such as
    `fe80::1%eth0` cannot be matched by a rule and is left out)."""
    out: list[str] = []
    for s in servers:
        try:
            addr = ipaddress.ip_address(s)
        except ValueError:
            continue
        if getattr(addr, "scope_id", None) or str(addr) in out:
            continue
        out.append(str(addr))
    return tuple(out)


def _of_family(values: Iterable[str], family: int) -> tuple[str, ...]:
    """The CIDRs or addresses of one IP version ("*" kept)."""
    return tuple(
        v for v in values if v == ALL or ipaddress.ip_network(v, strict=False).version == family
    )


# --- the rules ---------------------------------------------------------------------------------


def jump_rules(settings: CaptureSettings) -> tuple[str, ...]:
    """The rules in built-in chains that send traffic into ours (`-A CHAIN spec`)."""
    rules = [f"-A PREROUTING -p tcp -j {INBOUND}", f"-A OUTPUT -p tcp -j {OUTPUT}"]
    if settings.capture_dns:
        rules.append(f"-A OUTPUT -p udp -j {OUTPUT}")
    return tuple(rules)


def chain_rules(settings: CaptureSettings, family: int = 4) -> tuple[str, ...]:
    """The rules inside our own chains, in order, for iptables (`family` 4) or ip6tables (6)."""
    host = 32 if family == 4 else 128
    r: list[str] = []
    # Inbound: excluded ports first, then what is included.
    r += (f"-A {INBOUND} {_tcp_port(port)} -j RETURN" for port in settings.exclude_inbound_ports)
    r += _included(INBOUND, IN_REDIRECT, settings.include_inbound_ports, _tcp_port, "-p tcp ")
    r.append(f"-A {IN_REDIRECT} -p tcp -j REDIRECT --to-ports {settings.inbound_port}")

    # Outbound: the proxy's own traffic is never captured (that is what prevents loops) ...
    for uid in settings.proxy_uids:
        r.append(f"-A {OUTPUT} -m owner --uid-owner {uid} -j RETURN")
    for gid in settings.proxy_gids:
        r.append(f"-A {OUTPUT} -m owner --gid-owner {gid} -j RETURN")
    if settings.capture_dns:
        # ... the app's DNS queries to its resolvers go to the agent, whatever else is excluded
        # (a resolver on loopback, e.g. 127.0.0.53, included) ...
        for server in _of_family(settings.dns_servers, family):
            for proto in ("udp", "tcp"):
                r.append(
                    f"-A {OUTPUT} -d {server}/{host} -p {proto} -m {proto} --dport 53 "
                    f"-j REDIRECT --to-ports {settings.dns_port}"
                )
        # ... and no other UDP is touched (the jump for UDP exists only for DNS).
        r.append(f"-A {OUTPUT} -p udp -j RETURN")
    r.append(f"-A {OUTPUT} -d {'127.0.0.1' if family == 4 else '::1'}/{host} -j RETURN")
    r += (f"-A {OUTPUT} {_tcp_port(port)} -j RETURN" for port in settings.exclude_outbound_ports)
    excluded = _of_family(settings.exclude_outbound_ip_ranges, family)
    r += (f"-A {OUTPUT} {_to(cidr)} -j RETURN" for cidr in excluded)
    included = _of_family(settings.include_outbound_ip_ranges, family)
    r += _included(OUTPUT, REDIRECT, included, _to, "")
    r.append(f"-A {REDIRECT} -p tcp -j REDIRECT --to-ports {settings.outbound_port}")
    return tuple(r)


def _tcp_port(port: int | str) -> str:
    return f"-p tcp -m tcp --dport {port}"


def _to(cidr: str) -> str:
    return f"-d {cidr}"


def _included(
    chain: str, target: str, values: tuple[str, ...], match: Callable[[str], str], all_match: str
) -> list[str]:
    """Jumps from `chain` to `target`: one per included value (`match` spells its match), or
    a single one (matching `all_match`) when `*` includes everything."""
    if values == (ALL,):
        return [f"-A {chain} {all_match}-j {target}"]
    return [f"-A {chain} {match(v)} -j {target}" for v in values]


def installed_rules(settings: CaptureSettings, family: int = 4) -> tuple[str, ...]:
    """Everything `apply` adds to the nat table, as `iptables-save` lists it: our chain
    declarations, then the rules (jumps in built-in chains first, as iptables-save orders
    them). This is what `--dry-run` prints."""
    return (
        *(f":{chain} - [0:0]" for chain in CHAINS),
        *jump_rules(settings),
        *chain_rules(settings, family),
    )


# --- reading what is installed -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NatState:
    """Our part of an `iptables-save -t nat` dump: chains of ours that exist and the rules in
    built-in chains that jump to them."""

    chains: tuple[str, ...] = ()
    jumps: tuple[str, ...] = ()  # "-A OUTPUT -p tcp -j PILOTFISH_OUTPUT" as listed

    @property
    def empty(self) -> bool:
        return not self.chains and not self.jumps


def nat_table(text: str) -> Iterator[str]:
    """The lines of the nat table's section of `iptables-save` output, stripped."""
    table = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("*"):
            table = line[1:]
        elif table == TABLE:
            yield line


def parse_save(text: str) -> NatState:
    """Find our chains and the jumps into them in `iptables-save` output (any tables; only
    the nat table is read)."""
    chains: list[str] = []
    jumps: list[str] = []
    for line in nat_table(text):
        if line.startswith(":" + PREFIX):
            chains.append(line[1:].split()[0])
        elif line.startswith("-A ") and not line.split()[1].startswith(PREFIX):
            words = line.split()
            if "-j" in words and words[words.index("-j") + 1].startswith(PREFIX):
                jumps.append(line)
    return NatState(tuple(chains), tuple(jumps))


# --- scripts for iptables-restore --noflush ----------------------------------------------------


def _delete(rule: str) -> str:
    return "-D " + rule.removeprefix("-A ")


def cleanup_script(state: NatState) -> str | None:
    """Remove exactly what is ours: the jumps, then our chains (flushed first, since a chain
    must be empty to be deleted). None when there is nothing to remove."""
    if state.empty:
        return None
    lines = [f"*{TABLE}", *(_delete(j) for j in state.jumps)]
    lines += [f"-F {c}" for c in state.chains]
    lines += [f"-X {c}" for c in state.chains]
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


def apply_script(settings: CaptureSettings, state: NatState, family: int = 4) -> str:
    """Install the rules in one transaction, replacing any earlier install (idempotent):
    existing jumps of ours are deleted, and declaring a chain that exists flushes it; chains
    of ours that this version no longer uses are removed."""
    lines = [f"*{TABLE}"]
    lines += [_delete(j) for j in state.jumps]
    stale = [c for c in state.chains if c not in CHAINS]
    lines += [f"-F {c}" for c in stale]
    lines += [f"-X {c}" for c in stale]
    lines += [f":{chain} - [0:0]" for chain in CHAINS]
    lines += jump_rules(settings)
    lines += chain_rules(settings, family)
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"
