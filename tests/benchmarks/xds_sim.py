"""Simulated Envoy xDS subscriptions, sans-IO: what a proxy asks for next and when it has
converged. The load tool (xds_load.py) wraps these in grpc.aio streams; the unit tests
(tests/unit/test_xds_sim.py) drive them with responses built by hand.

A simulated proxy subscribes as Envoy does over ADS: CDS wildcard; EDS by name for every
cluster of type EDS it received; once the first clusters have their endpoints, LDS wildcard;
RDS by name for every route configuration its HTTP listeners name. It ACKs every response
(it never rejects config). It has converged when it has ACKed CDS and LDS and holds an ACKed
EDS and RDS resource for every name it learned; a later push makes it unconverged until it
has ACKed that push's responses.

Responses are decoded cheaply (`Decoder`): only the top-level strings of a response are
parsed per stream; what a response says about names (the EDS clusters a CDS response
declares, the route names of listeners, the churn marker of endpoints) is worked out once per
distinct resource bytes and shared by every simulated proxy of the process.

Churn markers: an endpoint whose address is `marker_address(j)` (j >= 1) carries marker j.
A proxy remembers the highest marker it has ACKed and when, so a benchmark that moves one
endpoint to `marker_address(j)` at change j can tell when each proxy had change j.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)
from envoy.service.discovery.v3.discovery_pb2 import (
    DeltaDiscoveryRequest,
    DeltaDiscoveryResponse,
    DiscoveryRequest,
    DiscoveryResponse,
)
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, struct_pb2

from protos import typeurls, wire
from tests.support.wire import delta_discovery_response, discovery_response, field_string

CDS, EDS, LDS, RDS = typeurls.CLUSTER, typeurls.ENDPOINT, typeurls.LISTENER, typeurls.ROUTE
SHORT = {CDS: "CDS", EDS: "EDS", LDS: "LDS", RDS: "RDS"}
_HCM_TYPE = "type.googleapis.com/" + HttpConnectionManager.DESCRIPTOR.full_name

# --- proxy identities ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProxyIdentity:
    """Who a simulated proxy claims to be: what the agent puts in Envoy's node."""

    index: int
    ip: str
    pod: str
    namespace: str = "default"
    service_account: str = "default"

    @property
    def node_id(self) -> str:
        return f"sidecar~{self.ip}~{self.pod}.{self.namespace}~{self.namespace}.svc.cluster.local"

    def metadata(self) -> dict[str, object]:
        """The node metadata the agent sends (agent/config.py), plus AUTO_REGISTER=false: a
        simulated proxy has no workload behind it, so it must not become an endpoint."""
        return {
            "NAME": self.pod,
            "NAMESPACE": self.namespace,
            "INSTANCE_IPS": self.ip,
            "SERVICE_ACCOUNT": self.service_account,
            "LABELS": {"app": "load-client"},
            "INTERCEPTION_MODE": "NONE",
            "CLUSTER_ID": "Kubernetes",
            "SDS": "true",
            "AUTO_REGISTER": "false",
        }


def proxy_identity(index: int, namespace: str = "default") -> ProxyIdentity:
    """The index-th simulated proxy: a loopback pod IP of its own (127.20.0.1, 127.20.0.2, …;
    never .0 or .255) and a pod name that says what it is."""
    if index < 0:
        raise ValueError("proxy index must not be negative")
    ip = f"127.{20 + index // 62500}.{(index // 250) % 250 + 1}.{index % 250 + 1}"
    return ProxyIdentity(index, ip, f"load-{index}", namespace)


# --- churn markers -------------------------------------------------------------------------


def marker_address(j: int) -> str:
    """The endpoint address that carries churn marker j (10.200.0.2 for 1, …)."""
    if not 1 <= j < 50 * 62500:
        raise ValueError(f"marker {j} out of range")
    return f"10.{200 + j // 62500}.{(j // 250) % 250}.{j % 250 + 1}"


def marker_of(address: str) -> int:
    """The churn marker an endpoint address carries, 0 for an ordinary address."""
    parts = address.split(".")
    if len(parts) != 4 or parts[0] != "10":
        return 0
    try:
        b, c, d = int(parts[1]), int(parts[2]), int(parts[3])
    except ValueError:
        return 0
    if b < 200 or c >= 250 or not 1 <= d <= 250:
        return 0
    return (b - 200) * 62500 + c * 250 + d - 1


# --- decoding responses --------------------------------------------------------------------


def _lite_messages() -> tuple[type, type]:
    """Message classes that declare only the small top-level fields of (Delta)Discovery-
    Response: parsing one skips the resources as unknown bytes, in microseconds, where the full
    message costs a millisecond per thousand resources."""
    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name="pilotfish_load_lite.proto", package="pilotfish.load", syntax="proto3"
    )
    sotw = fdp.message_type.add(name="LiteResponse")
    for name, number in (("version_info", 1), ("type_url", 4), ("nonce", 5)):
        sotw.field.add(name=name, number=number, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    res = fdp.message_type.add(name="LiteResource")
    for name, number in (("version", 1), ("name", 3)):
        res.field.add(name=name, number=number, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    delta = fdp.message_type.add(name="LiteDelta")
    delta.field.add(
        name="system_version_info", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL
    )
    delta.field.add(
        name="resources",
        number=2,
        type=f.TYPE_MESSAGE,
        label=f.LABEL_REPEATED,
        type_name=".pilotfish.load.LiteResource",
    )
    delta.field.add(name="type_url", number=4, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    delta.field.add(name="nonce", number=5, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    delta.field.add(name="removed_resources", number=6, type=f.TYPE_STRING, label=f.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName("pilotfish.load.LiteResponse")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName("pilotfish.load.LiteDelta")),
    )


_LiteResponse, _LiteDelta = _lite_messages()


@dataclass(frozen=True, slots=True)
class Facts:
    """What one resource tells a proxy: its name, the names it makes the proxy subscribe to
    (the EDS name of an EDS cluster, the route names of a listener), its churn marker."""

    name: str
    wants: frozenset[str] = frozenset()
    marker: int = 0


@dataclass(frozen=True, slots=True)
class Content:
    """What a SotW response holds (shared by every proxy that gets the same version)."""

    type_url: str
    names: frozenset[str]
    wants: frozenset[str]  # union over the resources
    marker: int  # highest over the resources


@dataclass(frozen=True, slots=True)
class Response:
    """One decoded response. SotW: `content` holds what it carries (the whole state for CDS
    and LDS; the assignments or routes that changed, or all of them, for EDS and RDS). Delta:
    `updated` holds the resources sent, `removed` the names taken away."""

    type_url: str
    version: str
    nonce: str
    content: Content | None = None
    updated: tuple[Facts, ...] = ()
    removed: tuple[str, ...] = ()

    @property
    def marker(self) -> int:
        if self.content is not None:
            return self.content.marker
        return max((f.marker for f in self.updated), default=0)


def facts_of(type_url: str, value: bytes) -> Facts:
    """Decode one resource (the `value` of its Any) into Facts."""
    if type_url == CDS:
        c = Cluster.FromString(value)
        if c.type == Cluster.EDS:
            return Facts(c.name, frozenset((c.eds_cluster_config.service_name or c.name,)))
        return Facts(c.name)
    if type_url == EDS:
        cla = ClusterLoadAssignment.FromString(value)
        marker = 0
        for locality in cla.endpoints:
            for lb in locality.lb_endpoints:
                marker = max(marker, marker_of(lb.endpoint.address.socket_address.address))
        return Facts(cla.cluster_name, marker=marker)
    if type_url == LDS:
        listener = Listener.FromString(value)
        routes: set[str] = set()
        chains = [*listener.filter_chains]
        if listener.HasField("default_filter_chain"):
            chains.append(listener.default_filter_chain)
        for chain in chains:
            for flt in chain.filters:
                if flt.typed_config.type_url == _HCM_TYPE:
                    hcm = HttpConnectionManager.FromString(flt.typed_config.value)
                    if hcm.HasField("rds"):
                        routes.add(hcm.rds.route_config_name)
        return Facts(listener.name, frozenset(routes))
    # Route configurations and anything else: only the name matters. Every xDS resource
    # has `name` as field 1.
    return Facts(wire.scan_strings(value, frozenset((1,))).get(1, ""))


class Decoder:
    """Decodes responses for every simulated proxy of a process, sharing the work: the full
    message is parsed only for a (type, version, nonce) not seen before (SotW) or for resource bytes
    not seen before (delta, and the resources of a new SotW version)."""

    def __init__(self, max_entries: int = 200_000) -> None:
        self._contents: dict[tuple[str, str, str], Content] = {}
        self._facts: dict[tuple[str, bytes], Facts] = {}
        self._max = max_entries
        self.full_decodes = 0  # responses parsed in full (for the curious)

    def _facts_of(self, type_url: str, value: bytes) -> Facts:
        key = (type_url, value)
        found = self._facts.get(key)
        if found is None:
            if len(self._facts) >= self._max:
                self._facts.clear()
            found = self._facts[key] = facts_of(type_url, value)
        return found

    def sotw(self, raw: bytes) -> Response:
        lite = _LiteResponse.FromString(raw)
        type_url, version = lite.type_url, lite.version_info
        # The nonce belongs in the key: an EDS response that carries only what changed has the
        # version of the whole set, which a proxy that subscribes afresh receives in full.
        key = (type_url, version, lite.nonce)
        content = self._contents.get(key)
        if content is None:
            self.full_decodes += 1
            full = DiscoveryResponse.FromString(raw)
            facts = [self._facts_of(type_url, a.value) for a in full.resources]
            content = Content(
                type_url,
                frozenset(f.name for f in facts),
                frozenset().union(*(f.wants for f in facts)),
                max((f.marker for f in facts), default=0),
            )
            if len(self._contents) >= self._max:
                self._contents.clear()
            self._contents[key] = content
        return Response(type_url, version, lite.nonce, content=content)

    def delta(self, raw: bytes) -> Response:
        lite = _LiteDelta.FromString(raw)
        type_url = lite.type_url
        updated: tuple[Facts, ...] = ()
        if lite.resources:
            # The resource bytes identify the facts; a proxy-independent resource (most of
            # them) is decoded once per process.
            self.full_decodes += 1
            full = DeltaDiscoveryResponse.FromString(raw)
            updated = tuple(self._facts_of(type_url, r.resource.value) for r in full.resources)
        return Response(
            type_url,
            lite.system_version_info,
            lite.nonce,
            updated=updated,
            removed=tuple(lite.removed_resources),
        )


# --- requests ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """A request the proxy sends. SotW: `names` is the whole subscription. Delta:
    `subscribe`/`unsubscribe` are changes. `error` NACKs (the simulated proxies never do,
    but the encoder supports it for tests)."""

    type_url: str
    nonce: str = ""
    version: str = ""
    names: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    unsubscribe: tuple[str, ...] = ()
    first: bool = False  # the stream's first request carries the node
    error: str = ""


class Encoder:
    """Encodes requests to bytes. The name lists (a thousand cluster names in every EDS ACK of
    every proxy) are encoded once per distinct list and appended: concatenated protobuf
    encodings merge, and repeated fields append."""

    def __init__(self, identity: ProxyIdentity, names_cache: dict[tuple[str, ...], bytes]) -> None:
        node = DiscoveryRequest()
        node.node.id = identity.node_id
        node.node.cluster = "load-client"
        meta = struct_pb2.Struct()
        meta.update(identity.metadata())
        node.node.metadata.CopyFrom(meta)
        self._node_sotw = node.SerializeToString()  # field 2 = node
        delta = DeltaDiscoveryRequest()
        delta.node.CopyFrom(node.node)
        self._node_delta = delta.SerializeToString()  # field 1 = node
        self._names = names_cache

    def _block(self, field_number: int, names: tuple[str, ...]) -> bytes:
        if not names:
            return b""
        key = (str(field_number), *names)
        found = self._names.get(key)
        if found is None:
            found = b"".join(field_string(field_number, n) for n in names)
            if len(self._names) > 10_000:
                self._names.clear()
            self._names[key] = found
        return found

    def sotw(self, req: Request) -> bytes:
        msg = DiscoveryRequest(
            version_info=req.version, type_url=req.type_url, response_nonce=req.nonce
        )
        if req.error:
            msg.error_detail.code = 3
            msg.error_detail.message = req.error
        head = self._node_sotw if req.first else b""
        return head + msg.SerializeToString() + self._block(3, req.names)

    def delta(self, req: Request) -> bytes:
        msg = DeltaDiscoveryRequest(type_url=req.type_url, response_nonce=req.nonce)
        if req.error:
            msg.error_detail.code = 3
            msg.error_detail.message = req.error
        head = self._node_delta if req.first else b""
        return (
            head
            + msg.SerializeToString()
            + self._block(3, req.subscribe)
            + self._block(4, req.unsubscribe)
        )


# --- the subscription state machines -------------------------------------------------------


@dataclass(slots=True)
class _Sub:
    """One type's subscription on a simulated proxy."""

    names: frozenset[str] = frozenset()  # what we asked for (SotW EDS/RDS; delta: all)
    requested: bool = False
    version: str = ""  # last version accepted
    nonce: str = ""  # last nonce received
    acked: bool = False  # the last response was ACKed
    have: frozenset[str] = frozenset()  # names we hold
    wants: dict[str, frozenset[str]] = field(default_factory=dict)  # delta: name -> wants


@dataclass(slots=True)
class Counters:
    responses: dict[str, int] = field(default_factory=dict)
    acks: dict[str, int] = field(default_factory=dict)

    def count(self, kind: dict[str, int], type_url: str) -> None:
        short = SHORT.get(type_url, type_url)
        kind[short] = kind.get(short, 0) + 1


class SimulatedProxy:
    """The subscriptions of one simulated Envoy on one ADS stream (SotW or delta).

    `start()` gives the first requests; `on_response(resp, now)` the requests to send in
    answer, in order. `converged` says whether it holds ACKed config for everything it
    learned; `converged_at` is when that first became true; `markers` lists (marker, time
    ACKed) each time the highest churn marker it holds went up (`now` of the response that
    brought it: the ACK is written right after).
    """

    def __init__(self, identity: ProxyIdentity, *, delta: bool = False, lds: bool = True) -> None:
        self.identity = identity
        self.delta = delta
        self.lds = lds
        self._subs: dict[str, _Sub] = {}
        self.converged = False
        self.converged_at: float | None = None
        self.marker = 0
        self.markers: list[tuple[int, float]] = []
        self.counters = Counters()

    # --- requests out ----------------------------------------------------------------------

    def start(self) -> list[Request]:
        self._subs = {CDS: _Sub(requested=True)}
        return [Request(CDS, first=True)]

    def _subscribe(self, type_url: str, names: frozenset[str]) -> Request | None:
        """A request that changes the subscription of `type_url` to `names` (None when
        unchanged). SotW sends the whole list with the last version and nonce; delta sends
        the difference."""
        sub = self._subs.setdefault(type_url, _Sub())
        if sub.requested and sub.names == names:
            return None
        old, sub.names, sub.requested = sub.names, names, True
        if self.delta:
            # What the proxy unsubscribes from it drops (the server forgets it too).
            sub.have = sub.have & names
            for gone in old - names:
                sub.wants.pop(gone, None)
            return Request(
                type_url,
                subscribe=tuple(sorted(names - old)),
                unsubscribe=tuple(sorted(old - names)),
            )
        return Request(type_url, nonce=sub.nonce, version=sub.version, names=tuple(sorted(names)))

    def _ack(self, type_url: str, sub: _Sub) -> Request:
        sub.acked = True
        self.counters.count(self.counters.acks, type_url)
        if self.delta:
            return Request(type_url, nonce=sub.nonce)
        wildcard = type_url in (CDS, LDS)
        names = () if wildcard else tuple(sorted(sub.names))
        return Request(type_url, nonce=sub.nonce, version=sub.version, names=names)

    # --- responses in ----------------------------------------------------------------------

    def on_response(self, resp: Response, now: float) -> list[Request]:
        type_url = resp.type_url
        self.counters.count(self.counters.responses, type_url)
        sub = self._subs.get(type_url)
        if sub is None:
            sub = self._subs[type_url] = _Sub()
        sub.nonce, sub.version, sub.acked = resp.nonce, resp.version, False
        wants = self._apply(sub, resp)
        out: list[Request] = []
        # Envoy asks for what a CDS or LDS response names before it ACKs that response (the
        # clusters warm on their endpoints, the listeners on their routes).
        if type_url == CDS:
            req = self._subscribe(EDS, wants)
            if req is not None:
                out.append(req)
        elif type_url == LDS:
            req = self._subscribe(RDS, wants)
            if req is not None:
                out.append(req)
        out.append(self._ack(type_url, sub))
        if type_url == EDS and resp.marker > self.marker:
            self.marker = resp.marker
            self.markers.append((resp.marker, now))
        # LDS once the first clusters are warm: their endpoints arrived, or none are needed.
        if self.lds and LDS not in self._subs and self._clusters_warm():
            self._subs[LDS] = _Sub(requested=True)
            out.append(Request(LDS))
        self._update_converged(now)
        return out

    def _apply(self, sub: _Sub, resp: Response) -> frozenset[str]:
        """Update what the proxy holds of this type; returns the names it now wants of the
        dependent type (EDS for CDS, RDS for LDS)."""
        if resp.content is not None:
            if resp.type_url in (EDS, RDS):
                # SotW sends listeners and clusters complete; an EDS or RDS response may
                # carry only what changed, and Envoy keeps the ones it does not name.
                sub.have = sub.have | resp.content.names
            else:
                sub.have = resp.content.names
            return resp.content.wants
        have = set(sub.have)
        for f in resp.updated:
            have.add(f.name)
            sub.wants[f.name] = f.wants
        for name in resp.removed:
            have.discard(name)
            sub.wants.pop(name, None)
        sub.have = frozenset(have)
        return frozenset().union(*sub.wants.values())

    def _clusters_warm(self) -> bool:
        cds, eds = self._subs.get(CDS), self._subs.get(EDS)
        if cds is None or not cds.acked:
            return False
        if eds is None or not eds.names:
            return True
        return eds.names <= eds.have

    def _update_converged(self, now: float) -> None:
        ok = self._holds(CDS, wildcard=True) and self._holds(EDS)
        if self.lds:
            ok = ok and self._holds(LDS, wildcard=True) and self._holds(RDS)
        self.converged = ok
        if ok and self.converged_at is None:
            self.converged_at = now

    def _holds(self, type_url: str, *, wildcard: bool = False) -> bool:
        sub = self._subs.get(type_url)
        if sub is None:
            # A dependent type nobody asked for (no EDS clusters, no HTTP listeners).
            return not wildcard
        if wildcard:
            return sub.acked
        if not sub.names:
            return True
        return sub.acked and sub.names <= sub.have

    # --- reports ---------------------------------------------------------------------------

    def holds(self, type_url: str) -> frozenset[str]:
        sub = self._subs.get(type_url)
        return sub.have if sub is not None else frozenset()


def sotw_response(
    type_url: str, resources: Iterable[tuple[str, bytes]], version: str, nonce: str
) -> bytes:
    """A DiscoveryResponse from (type, serialized resource) pairs (for tests)."""
    anys = [wire.any_bytes(t, v) for t, v in resources]
    return discovery_response(version, anys, type_url, nonce)


def delta_response(
    type_url: str,
    resources: Iterable[tuple[str, str, bytes]],
    nonce: str,
    removed: Iterable[str] = (),
) -> bytes:
    """A DeltaDiscoveryResponse from (name, version, serialized resource) triples."""
    rs = [wire.delta_resource(n, v, wire.any_bytes(type_url, b)) for n, v, b in resources]
    return delta_discovery_response("1", rs, type_url, list(removed), nonce)
