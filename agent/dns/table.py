"""The name table as the DNS server looks names up in it (sans-IO).

`LookupTable.build()` turns the control plane's `NameTable` into plain dicts once per table;
`lookup()` is then a few dict probes per query. The rules, as Istio's agent applies them:

- names are case-insensitive and compared without the trailing dot;
- an exact hostname first; then the short forms of Kubernetes services (`svc.ns`,
  `svc.ns.svc`, and `svc` alone for the agent's own namespace, as its search path implies);
  then the closest wildcard (`*.example.com` covers `a.example.com` and `a.b.example.com`,
  never `example.com` itself);
- a known name with a search domain appended (`backend.default.svc.cluster.local.default.svc.
  cluster.local`, what a resolver with `ndots:5` asks first) is answered with a CNAME to the
  canonical name, saving the client a round trip per search domain.

A name that is none of these is not ours: the caller forwards the query upstream.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

TTL = 30


class NameTableError(ValueError):
    """The name table is unusable; the handler NACKs it with this message."""


@dataclass(frozen=True, slots=True, eq=False)
class HostEntry:
    """What one name resolves to. `name` is the canonical hostname (lowercase, no dot)."""

    name: str
    ipv4: tuple[str, ...]
    ipv6: tuple[str, ...]
    registry: str = ""
    shortname: str = ""
    namespace: str = ""


@dataclass(frozen=True, slots=True, eq=False)
class Match:
    """The entry a queried name found."""

    entry: HostEntry
    # True when the query named the host with a search domain appended: the answer is a CNAME
    # from the asked name to `entry.name`, then the addresses under `entry.name`.
    cname: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class NameInfo:
    """One row of the table as the control plane sent it (plain data, no protobuf)."""

    ips: tuple[str, ...]
    registry: str = ""
    shortname: str = ""
    namespace: str = ""


def kubernetes_search_domains(namespace: str, cluster_domain: str) -> tuple[str, ...]:
    """The search path Kubernetes gives a pod (`ndots:5`, these three domains)."""
    return (f"{namespace}.svc.{cluster_domain}", f"svc.{cluster_domain}", cluster_domain)


class LookupTable:
    """An immutable index over one name table. Build it with `build()`."""

    __slots__ = ("_exact", "_search", "_wildcards", "hosts", "version")

    def __init__(
        self,
        hosts: Mapping[str, HostEntry],
        exact: Mapping[str, HostEntry],
        wildcards: Mapping[str, HostEntry],
        search_domains: tuple[str, ...],
        version: int,
    ) -> None:
        self.hosts = hosts  # canonical entries by hostname (for /debug/ndsz)
        self._exact = exact  # hostnames and alt names -> entry
        self._wildcards = wildcards  # "example.com" for "*.example.com" -> entry
        self._search = tuple("." + d for d in search_domains)
        self.version = version

    @classmethod
    def build(
        cls,
        table: Mapping[str, NameInfo],
        *,
        namespace: str,
        cluster_domain: str = "cluster.local",
        search_domains: Iterable[str] = (),
        version: int = 0,
    ) -> LookupTable:
        """Validate and index a table; raises NameTableError naming the first bad row."""
        hosts: dict[str, HostEntry] = {}
        for raw_name in sorted(table):
            info = table[raw_name]
            name = _normalize(raw_name)
            _check_hostname(raw_name, name)
            if name in hosts:
                raise NameTableError(f"host {raw_name!r} appears twice (names are case-blind)")
            v4, v6 = _split_ips(raw_name, info.ips)
            hosts[name] = HostEntry(name, v4, v6, info.registry, info.shortname, info.namespace)
        exact: dict[str, HostEntry] = {}
        wildcards: dict[str, HostEntry] = {}
        for name, entry in hosts.items():
            if name.startswith("*."):
                wildcards[name[2:]] = entry
            else:
                exact[name] = entry
        # Alt names never shadow a real hostname, and the first service (by name) keeps a
        # contested one, so the answer does not depend on the order the table arrived in.
        for entry in hosts.values():
            for alt in alt_names(entry, namespace, cluster_domain):
                exact.setdefault(alt, entry)
        domains = []
        for d in search_domains:
            d = _normalize(d)
            if d and d not in domains:
                domains.append(d)
        return cls(hosts, exact, wildcards, tuple(domains), version)

    @property
    def search_domains(self) -> tuple[str, ...]:
        return tuple(d[1:] for d in self._search)

    def lookup(self, qname: str) -> Match | None:
        """The entry that answers `qname` (any case, trailing dot or not); None: not ours."""
        name = _normalize(qname)
        entry = self._direct(name)
        if entry is not None:
            return Match(entry)
        for suffix in self._search:
            if name.endswith(suffix) and len(name) > len(suffix):
                entry = self._direct(name[: -len(suffix)])
                if entry is not None:
                    return Match(entry, cname=True)
        return None

    def _direct(self, name: str) -> HostEntry | None:
        entry = self._exact.get(name)
        if entry is not None or not self._wildcards:
            return entry
        # The closest wildcard wins: a.b.example.com tries *.b.example.com, then *.example.com.
        rest = name
        while True:
            dot = rest.find(".")
            if dot < 0:
                return None
            rest = rest[dot + 1 :]
            entry = self._wildcards.get(rest)
            if entry is not None:
                return entry

    def __len__(self) -> int:
        return len(self.hosts)

    def as_json(self) -> dict[str, Any]:
        """The table for /debug/ndsz: hosts as received, plus the names derived from them."""
        return {
            "version": self.version,
            "search_domains": list(self.search_domains),
            "hosts": {
                name: {
                    "ips": [*e.ipv4, *e.ipv6],
                    "registry": e.registry,
                    **({"shortname": e.shortname, "namespace": e.namespace} if e.shortname else {}),
                }
                for name, e in sorted(self.hosts.items())
            },
            "alt_names": {alt: e.name for alt, e in sorted(self._exact.items()) if alt != e.name},
        }


def alt_names(entry: HostEntry, namespace: str, cluster_domain: str) -> list[str]:
    """The short forms of a Kubernetes service: `svc.ns`, `svc.ns.svc`, and `svc` when it is
    in the agent's own namespace (in another namespace the bare name means something else)."""
    short, ns = entry.shortname.lower(), entry.namespace.lower()
    if entry.registry != "Kubernetes" or not short or not ns:
        return []
    if entry.name != f"{short}.{ns}.svc.{cluster_domain.lower()}":
        return []  # not a cluster-local name: its short forms would be guesses
    out = [f"{short}.{ns}", f"{short}.{ns}.svc"]
    if ns == namespace.lower():
        out.append(short)
    return out


def _normalize(name: str) -> str:
    return name.lower().rstrip(".")


def _check_hostname(raw: str, name: str) -> None:
    if not name or len(name) > 253:
        raise NameTableError(f"host {raw!r} is not a valid DNS name")
    labels = name.split(".")
    for i, label in enumerate(labels):
        if not 0 < len(label) <= 63 or ("*" in label and (i != 0 or label != "*")):
            raise NameTableError(f"host {raw!r} is not a valid DNS name")
    if labels[0] == "*" and len(labels) < 2:
        raise NameTableError(f"host {raw!r}: a wildcard needs a domain")


def _split_ips(host: str, ips: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    v4: list[str] = []
    v6: list[str] = []
    for text in ips:
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            raise NameTableError(f"host {host!r}: {text!r} is not an IP address") from None
        bucket = v4 if ip.version == 4 else v6
        if str(ip) not in bucket:
            bucket.append(str(ip))
    return tuple(v4), tuple(v6)
