"""GatewayIndex: which Gateways a router serves, how their servers merge into listeners, and
which VirtualServices bind to each server. Sans-IO: the config in, decisions out.

- A Gateway selects routers by `selector` labels, in any namespace (Istio's default).
- Servers of every selecting Gateway are merged per address (`bind`, else the router's
  default) and port, in Istio's order: gateways oldest first (here: by namespace/name, the
  order files give no timestamps for), then servers in order. The first server on a port
  decides what the port is: HTTP (HTTP, HTTP2, GRPC share one connection manager, told apart
  by virtual host), TLS (HTTPS and TLS servers, told apart by SNI filter chain), or TCP (one
  server: TCP carries nothing to tell two apart). A later server of another kind, a second
  TCP server, or a TLS-kind server repeating a host already served on the port loses (the
  hosts it repeats, or the whole server); each loss is one `ServerConflict` naming both.
- A server's port is the router Service's port, as in Istio: when a Service selecting the
  router has that port with a numeric targetPort, the listener listens on the targetPort
  (a Gateway's `port: 80` is served on 8080 behind a Service mapping 80 to 8080); otherwise
  on the number itself.
- A VirtualService binds to a server when it names the gateway (`bound_to`), is exported to
  the gateway's namespace, and one of its hosts intersects one of the server's `ns/host`
  entries (`ns` is `*` or the VirtualService's namespace).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from operator import attrgetter

from control.model.gateway import Gateway, GatewayServer, ServerTlsMode
from control.model.traffic import VirtualService, bound_to, exported_to
from control.model.types import Labels, MeshConfig, Protocol, Service
from control.model.vs_carry import Replaced


class PortKind(enum.StrEnum):
    HTTP = "HTTP"  # plaintext HTTP/1.1, HTTP2, GRPC: one HCM, virtual hosts by Host
    TLS = "TLS"  # HTTPS and TLS: filter chains by SNI
    TCP = "TCP"


def port_kind(server: GatewayServer) -> PortKind:
    if server.protocol.is_http:
        return PortKind.HTTP
    if server.protocol in (Protocol.HTTPS, Protocol.TLS):
        return PortKind.TLS
    return PortKind.TCP


@dataclass(frozen=True, slots=True)
class BoundServer:
    """One server of one Gateway as a listener serves it: `hosts` are the server's `ns/host`
    entries that survived the merge (all of them unless another server had some first)."""

    gateway: Gateway
    server: GatewayServer
    position: int  # index in gateway.servers
    hosts: tuple[str, ...]

    @property
    def label(self) -> str:
        """How warnings name it: `Gateway ns/name servers[i] (file:line)`."""
        return f"{self.gateway.source} servers[{self.position}]"

    @property
    def terminates(self) -> bool:
        """TLS is terminated here (HTTPS, or TLS not in PASSTHROUGH)."""
        tls = self.server.tls
        return (
            port_kind(self.server) is PortKind.TLS
            and tls is not None
            and tls.mode is not ServerTlsMode.PASSTHROUGH
        )

    @property
    def route_name(self) -> str:
        """Istio's RDS names: `http.<port>` for a plaintext port (every server on it shares
        it), `https.<port>.<port name>.<gateway>.<namespace>` for a terminated HTTPS server."""
        if self.server.protocol.is_http:
            return f"http.{self.server.port}"
        s, g = self.server, self.gateway
        # An unnamed port gets its position, so two unnamed servers do not share routes.
        name = s.port_name or f"{s.protocol.lower()}-{self.position}"
        return f"https.{s.port}.{name}.{g.name}.{g.namespace}"


@dataclass(frozen=True, slots=True)
class GatewayListener:
    """The servers one Envoy listener (one address and port) serves, in precedence order;
    `port` is where it listens (the servers' port, or its Service's targetPort)."""

    bind: str
    port: int
    kind: PortKind
    servers: tuple[BoundServer, ...]


@dataclass(frozen=True, slots=True)
class ServerConflict:
    kept: BoundServer
    lost: BoundServer
    reason: str

    def message(self) -> str:
        return (
            f"port {self.lost.server.port}: {self.lost.label} conflicts with {self.kept.label}: "
            f"{self.reason}; {self.kept.label} is used"
        )


def _host_part(entry: str) -> str:
    return entry.partition("/")[2]


def host_intersection(a: str, b: str) -> str | None:
    """The hosts both patterns match, as one pattern (the more specific of the two), or None.
    Patterns are `*`, `*.suffix` wildcards or exact names (case-insensitive)."""
    a, b = a.lower(), b.lower()
    if a == b or b == "*":
        return a
    if a == "*":
        return b
    if a.startswith("*.") and b.endswith(a[1:]):
        return b
    if b.startswith("*.") and a.endswith(b[1:]):
        return a
    return None


def target_ports(services: Iterable[Service]) -> tuple[tuple[int, int], ...]:
    """Service port -> numeric targetPort of the Services selecting a router (the first by
    hostname wins a port two of them map)."""
    out: dict[int, int] = {}
    for service in sorted(services, key=lambda s: s.hostname):
        for p in service.ports:
            if isinstance(p.target_port, int) and p.target_port != p.port:
                out.setdefault(p.port, p.target_port)
    return tuple(sorted(out.items()))


def merge_servers(
    gateways: Iterable[Gateway], default_bind: str, port_map: Mapping[int, int] | None = None
) -> tuple[tuple[GatewayListener, ...], tuple[ServerConflict, ...]]:
    """Merge the servers of `gateways` (in precedence order) into listeners per address and
    listening port (`port_map`: server port -> targetPort); a server's `bind` overrides
    `default_bind`."""
    ports = port_map or {}
    by_address: dict[tuple[str, int], list[BoundServer]] = {}
    conflicts: list[ServerConflict] = []
    for gateway in gateways:
        for position, server in enumerate(gateway.servers):
            candidate = BoundServer(gateway, server, position, server.hosts)
            listen = ports.get(server.port, server.port)
            members = by_address.setdefault((server.bind or default_bind, listen), [])
            kept = _admit(members, candidate, conflicts)
            if kept is not None:
                members.append(kept)
    listeners = tuple(
        GatewayListener(bind, port, port_kind(members[0].server), tuple(members))
        for (bind, port), members in sorted(by_address.items(), key=lambda kv: (kv[0][1], kv[0][0]))
        if members
    )
    return listeners, tuple(conflicts)


def _admit(
    members: list[BoundServer], candidate: BoundServer, conflicts: list[ServerConflict]
) -> BoundServer | None:
    if not members:
        return candidate
    first = members[0]
    kind, first_kind = port_kind(candidate.server), port_kind(first.server)
    if kind is not first_kind:
        reason = (
            f"protocol {candidate.server.protocol} cannot share the port with "
            f"{first.server.protocol}"
        )
        conflicts.append(ServerConflict(first, candidate, reason))
        return None
    if kind is PortKind.TCP:
        conflicts.append(ServerConflict(first, candidate, "a TCP port has one server"))
        return None
    if kind is PortKind.HTTP:
        return candidate  # virtual hosts of both are merged
    # TLS: one filter chain per SNI host; a host served twice goes to the first server.
    hosts = list(candidate.hosts)
    for member in members:
        taken = {_host_part(h) for h in member.hosts}
        repeated = [h for h in hosts if _host_part(h) in taken]
        if repeated:
            shown = ", ".join(_host_part(h) for h in repeated)
            conflicts.append(ServerConflict(member, candidate, f"duplicate host {shown}"))
            hosts = [h for h in hosts if h not in repeated]
    if not hosts:
        return None
    return BoundServer(candidate.gateway, candidate.server, candidate.position, tuple(hosts))


# One VirtualService bound to a server: its part for the gateway, and the hosts it serves
# through the server.
Binding = tuple[VirtualService, tuple[str, ...]]
# What binding one VirtualService to one server decided: the VirtualService, and its binding
# (None: it does not bind). The binding is the very tuple every later index answers while the
# VirtualService stays, so what is built from it can tell an unchanged one by identity.
_Decision = tuple[VirtualService, Binding | None]


@dataclass(frozen=True, slots=True)
class _Bindings:
    """The VirtualServices bound to one (gateway, server hosts), in (namespace, name) order;
    the decision for each VirtualService of the snapshot by its id() (the decision holds the
    object, so the id names no other), and where each binding is in `found` by its id()."""

    found: tuple[Binding, ...]
    decided: dict[int, _Decision]
    at: dict[int, int]


_BindingsKey = tuple[str, str, tuple[str, ...]]  # gateway ref, its namespace, server hosts


class GatewayIndex:
    """Per-router lookups over the snapshot's Gateways and the VirtualServices bound to them.

    Made with `previous` (the index of the snapshot before), the binding decisions of every
    VirtualService object the two snapshots share are taken over instead of made again, so
    a snapshot with one VirtualService changed binds that one; when `replaced` says the
    VirtualServices differ from the previous index's only in place (model/vs_carry.py), the
    previous order and bindings are patched instead of sorted and scanned again."""

    def __init__(
        self,
        config: MeshConfig,
        previous: GatewayIndex | None = None,
        replaced: Replaced | None = None,
    ) -> None:
        self.gateways = tuple(sorted(config.gateways, key=lambda g: g.key))
        self._replaced = replaced if previous is not None else None
        ordered = self._patched_order(previous, replaced)
        if ordered is None:
            vss = tuple(sorted(config.virtual_services, key=attrgetter("namespace", "name")))
            ordered = (vss, {id(vs): i for i, vs in enumerate(vss)})
            self._replaced = None
        self._virtual_services, self._position = ordered
        self._selecting: dict[tuple[Labels, str], tuple[Gateway, ...]] = {}
        self._listeners: dict[
            tuple[Labels, str, tuple[tuple[int, int], ...], str],
            tuple[tuple[GatewayListener, ...], tuple[ServerConflict, ...]],
        ] = {}
        self._bound: dict[tuple[str, str, tuple[str, ...]], tuple[Binding, ...]] = {}
        self._bindings: dict[_BindingsKey, _Bindings] = {}
        # Only the previous index's decisions, never its own previous: no chain of indexes.
        self._bindings_before = previous._bindings if previous is not None else {}

    @staticmethod
    def _patched_order(
        previous: GatewayIndex | None, replaced: Replaced | None
    ) -> tuple[tuple[VirtualService, ...], dict[int, int]] | None:
        """The previous index's VirtualServices in (namespace, name) order with `replaced`
        put in place (same names, so the same places), and each one's place by id()."""
        if previous is None or replaced is None:
            return None
        if not replaced.now:
            return previous._virtual_services, previous._position
        ordered, position = list(previous._virtual_services), dict(previous._position)
        for was, vs in zip(replaced.before, replaced.now, strict=True):
            i = position.pop(id(was), None)
            if i is None or ordered[i] is not was:
                return None
            ordered[i] = vs
            position[id(vs)] = i
        return tuple(ordered), position

    def selecting(self, labels: Labels, namespace: str = "") -> tuple[Gateway, ...]:
        """Gateways that a router's labels (and namespace) select, oldest first."""
        key = (labels, namespace)
        found = self._selecting.get(key)
        if found is None:
            found = self._selecting[key] = tuple(
                g for g in self.gateways if g.selects(labels, namespace)
            )
        return found

    def listeners(
        self,
        labels: Labels,
        default_bind: str,
        port_map: tuple[tuple[int, int], ...] = (),
        namespace: str = "",
    ) -> tuple[tuple[GatewayListener, ...], tuple[ServerConflict, ...]]:
        """The merged listeners of a router with these labels in `namespace`, and the
        conflicts merging them found (routers of one deployment share the answer)."""
        key = (labels, default_bind, port_map, namespace)
        found = self._listeners.get(key)
        if found is None:
            found = self._listeners[key] = merge_servers(
                self.selecting(labels, namespace), default_bind, dict(port_map)
            )
        return found

    def bindings(self, bound: BoundServer) -> tuple[Binding, ...]:
        """The VirtualServices (their parts for this gateway) bound to a server, in
        (namespace, name) order, each with the hosts it serves through the server."""
        gateway = bound.gateway
        key = (gateway.ref, str(bound.server.port), bound.hosts)
        found = self._bound.get(key)
        if found is None:
            triple = (gateway.ref, gateway.namespace, bound.hosts)
            made = self._bindings.get(triple)
            if made is None:
                before = self._bindings_before.get(triple)
                made = self._patched(before, triple) if before is not None else None
                if made is None:
                    made = self._bind(before, triple)
                self._bindings[triple] = made
            found = self._bound[key] = made.found
        return found

    def _bind(self, before: _Bindings | None, triple: _BindingsKey) -> _Bindings:
        """Every VirtualService's decision, taken over from `before` for the objects it
        decided."""
        decided: dict[int, _Decision] = {}
        earlier = before.decided if before is not None else {}
        found: list[Binding] = []
        at: dict[int, int] = {}
        for vs in self._virtual_services:
            entry = earlier.get(id(vs))
            if entry is None or entry[0] is not vs:
                entry = _decide(vs, *triple)
            decided[id(vs)] = entry
            if entry[1] is not None:
                at[id(entry[1])] = len(found)
                found.append(entry[1])
        return _Bindings(tuple(found), decided, at)

    def _patched(self, before: _Bindings, triple: _BindingsKey) -> _Bindings | None:
        """`before` with the replaced VirtualServices decided again, when each binds as the
        one it replaces did or not at all (else the bound ones move: None)."""
        replaced = self._replaced
        if replaced is None:
            return None
        if not replaced.now:
            return before
        found, decided, at = list(before.found), dict(before.decided), dict(before.at)
        for was, vs in zip(replaced.before, replaced.now, strict=True):
            old = decided.pop(id(was), None)
            if old is None or old[0] is not was:
                return None
            new = decided[id(vs)] = _decide(vs, *triple)
            if old[1] is None and new[1] is None:
                continue
            if old[1] is None or new[1] is None:
                return None
            i = at.pop(id(old[1]))
            found[i] = new[1]
            at[id(new[1])] = i
        return _Bindings(tuple(found), decided, at)

    def virtual_services(self, bound: BoundServer) -> tuple[VirtualService, ...]:
        """The VirtualServices (their parts for this gateway) bound to a server, in
        (namespace, name) order."""
        return tuple(vs for vs, _ in self.bindings(bound))


def _decide(vs: VirtualService, ref: str, namespace: str, hosts: tuple[str, ...]) -> _Decision:
    """Whether `vs` binds to a server of gateway `ref` (in `namespace`) with `hosts`, and how."""
    part = bound_to(vs, ref)
    if part is None or not exported_to(part.export_to, part.namespace, namespace):
        return (vs, None)
    served = server_hosts_for(hosts, part)
    return (vs, (part, served) if served else None)


def server_hosts_for(server_hosts: tuple[str, ...], vs: VirtualService) -> tuple[str, ...]:
    """The hosts a VirtualService serves through a server: each intersection of one of its
    hosts with one of the server's `ns/host` entries that admits its namespace."""
    out: list[str] = []
    for entry in server_hosts:
        namespace, _, pattern = entry.partition("/")
        if namespace not in ("*", vs.namespace):
            continue
        for host in vs.hosts:
            both = host_intersection(host, pattern)
            if both is not None and both not in out:
                out.append(both)
    return tuple(out)
