"""Envoy's access log entries decoded only as far as the standard metrics need (sans-IO).

Every request costs the agent one entry, and reading a protobuf field from Python costs far
more than parsing it in C, so the hot path reads few fields:

- A stream message is parsed with its entries left as bytes (`_StreamView`).
- Per HTTP entry, two reduced messages are parsed from those bytes in C: `_HttpLabelsView`,
  every field the labels are computed from (labels.py reads nothing else), and
  `_HttpValuesView`, the duration and sizes that are observed. Both are built at import from
  Envoy's own descriptors, so field numbers and types are Envoy's.
- The labels view, re-serialized deterministically (unknown fields dropped), is the key of a
  bounded cache of label tuples: a request from the same peer to the same cluster with the
  same outcome as an earlier one costs a dict lookup. Only a miss parses the whole entry and
  runs `http_labels` on it, so the labels are exactly those of the full entry.

A labels view holds no per-request value (ids, times, addresses, byte counts), so repeat
requests share a key; what makes keys distinct is what makes label sets distinct, which the
aggregator caps anyway.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from envoy.data.accesslog.v3.accesslog_pb2 import HTTPAccessLogEntry
from envoy.service.accesslog.v3.als_pb2 import StreamAccessLogsMessage
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from agent.telemetry.labels import LabelValues, http_labels
from agent.telemetry.overrides import SideOverrides, of_entry
from agent.telemetry.peers import PeerDirectory

DEFAULT_MAX_CACHED: Final = 4096
# A longer key (a huge authority, say) is not cached: the cache's memory stays bounded in
# bytes (about max_cached x this), not only in keys.
MAX_KEY_BYTES: Final = 2048

# What a reduced message keeps of Envoy's: a field name maps to None (the field whole, with
# Envoy's own type), to a nested selection (a reduced message of its own), or to RAW (a
# message field kept as its bytes: the same wire form, parsed later or not at all).
RAW: Final = "raw"
Selection = Mapping[str, "Selection | str | None"]

_LABEL_FIELDS: Final[Selection] = {
    "common_properties": {
        "custom_tags": None,
        "metadata": None,
        "tls_properties": {
            "peer_certificate_properties": {"subject_alt_name": None},
            "local_certificate_properties": {"subject_alt_name": None},
        },
        "upstream_cluster": None,
        # The upstream's address, which names it (peers.py); the port is per endpoint, not
        # per request, so it does not split keys more than the address does.
        "upstream_remote_address": None,
        # The caller's address names it (server side); its port is per connection, and
        # would split keys by connection.
        "downstream_direct_remote_address": {"socket_address": {"address": None}},
        "response_flags": None,
    },
    "request": {"authority": None, "request_headers": None},
    "response": {"response_code": None, "response_headers": None, "response_trailers": None},
}
_VALUE_FIELDS: Final[Selection] = {
    "common_properties": {"duration": None},
    "request": {"request_headers_bytes": None, "request_body_bytes": None},
    "response": {"response_headers_bytes": None, "response_body_bytes": None},
}
_STREAM_FIELDS: Final[Selection] = {
    # Only in a stream's first message; decoded so that a malformed one is refused as before.
    "identifier": None,
    "http_logs": {"log_entry": RAW},
    "tcp_logs": {"log_entry": RAW},
}
_PACKAGE: Final = "pilotfish.agent.alsview"


def _reduced_file() -> descriptor_pb2.FileDescriptorProto:
    out = descriptor_pb2.FileDescriptorProto(
        name="pilotfish/agent/alsview.proto", package=_PACKAGE, syntax="proto3"
    )
    deps: set[str] = set()

    def add(name: str, source: Descriptor, keep: Selection) -> str:
        proto = out.message_type.add(name=name)
        full = f"{_PACKAGE}.{name}"
        for field_name, nested in keep.items():
            field = source.fields_by_name[field_name]
            repeated = field.is_repeated
            f = proto.field.add(
                name=field.name,
                number=field.number,
                json_name=field.json_name,
                label=FieldDescriptor.LABEL_REPEATED
                if repeated
                else FieldDescriptor.LABEL_OPTIONAL,
                type=field.type,  # type: ignore[arg-type]
            )
            kind = field.message_type or field.enum_type
            if nested == RAW:
                f.type = FieldDescriptor.TYPE_BYTES  # type: ignore[assignment]
            elif isinstance(nested, Mapping):
                f.type_name = "." + add(f"{name}_{field.name}", field.message_type, nested)
            elif field.message_type is not None and field.message_type.GetOptions().map_entry:
                # A map's entry type must be nested in the map's own message.
                entry = proto.nested_type.add()
                field.message_type.CopyToProto(entry)
                deps.update(
                    v.message_type.file.name for v in field.message_type.fields if v.message_type
                )
                f.type_name = f".{full}.{entry.name}"
            elif kind is not None:
                deps.add(kind.file.name)
                f.type_name = "." + kind.full_name
        return full

    add("HttpLabels", HTTPAccessLogEntry.DESCRIPTOR, _LABEL_FIELDS)
    add("HttpValues", HTTPAccessLogEntry.DESCRIPTOR, _VALUE_FIELDS)
    add("Stream", StreamAccessLogsMessage.DESCRIPTOR, _STREAM_FIELDS)
    out.dependency.extend(sorted(deps))
    return out


def _classes() -> tuple[type[Message], type[Message], type[Message]]:
    pool = descriptor_pool.Default()
    pool.Add(_reduced_file())
    labels, values, stream = (
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{n}"))
        for n in ("HttpLabels", "HttpValues", "Stream")
    )
    return labels, values, stream


_HttpLabelsView, _HttpValuesView, _StreamView = _classes()


class StreamEntries(NamedTuple):
    """One stream message's entries, undecoded."""

    http: list[bytes]
    tcp: list[bytes]


def stream_entries(raw: bytes) -> StreamEntries:
    """The entries of a `StreamAccessLogsMessage` (DecodeError when it does not decode)."""
    message: Any = _StreamView.FromString(raw)
    return StreamEntries(list(message.http_logs.log_entry), list(message.tcp_logs.log_entry))


class HttpObservation(NamedTuple):
    """What one HTTP entry adds to the metrics."""

    labels: LabelValues
    side: SideOverrides  # the Telemetry overrides the entry's logger carries
    duration_ms: float
    request_bytes: int
    response_bytes: int


class LabelCache:
    """Label tuples (and the overrides that go with them) by the bytes they were decoded
    from: at most `max_cached` keys of at most MAX_KEY_BYTES; past that the oldest key is
    forgotten. The decoders count their own hits and misses on their hot path.

    Labels also read `peers`, the control plane's table, which the bytes do not hold: its
    owner calls `follow_peers()` before each batch, which forgets every label set when a new
    table has arrived since (a per-batch check keeps it off the per-request path)."""

    def __init__(
        self, max_cached: int = DEFAULT_MAX_CACHED, peers: PeerDirectory | None = None
    ) -> None:
        self.max_cached = max_cached
        self.peers = peers
        self._labels: dict[bytes, tuple[LabelValues, SideOverrides]] = {}
        self._peer_tables = peers.updates if peers is not None else 0
        self.hits = 0
        self.misses = 0

    def follow_peers(self) -> None:
        if self.peers is not None and self.peers.updates != self._peer_tables:
            self._peer_tables = self.peers.updates
            self._labels.clear()

    @property
    def cached(self) -> int:
        return len(self._labels)

    def _remember(self, key: bytes, value: tuple[LabelValues, SideOverrides]) -> None:
        if len(key) <= MAX_KEY_BYTES:
            if len(self._labels) >= self.max_cached:
                del self._labels[next(iter(self._labels))]
            self._labels[key] = value


class HttpDecoder(LabelCache):
    """HTTP entries (bytes) to observations, with the label tuples cached (LabelCache; the
    overrides come from a custom tag, which is part of the key)."""

    def decode(self, raw: bytes) -> HttpObservation:
        """DecodeError when `raw` is not an entry."""
        view: Any = _HttpLabelsView.FromString(raw)
        view.DiscardUnknownFields()
        key: bytes = view.SerializeToString(deterministic=True)
        cached = self._labels.get(key)
        if cached is None:
            self.misses += 1
            entry = HTTPAccessLogEntry.FromString(raw)
            cached = (http_labels(entry, self.peers), of_entry(entry.common_properties))
            self._remember(key, cached)
        else:
            self.hits += 1
        v: Any = _HttpValuesView.FromString(raw)
        common, request, response = v.common_properties, v.request, v.response
        duration = common.duration
        return HttpObservation(
            *cached,
            (duration.seconds * 1_000_000_000 + duration.nanos) / 1e6,
            request.request_headers_bytes + request.request_body_bytes,
            response.response_headers_bytes + response.response_body_bytes,
        )
