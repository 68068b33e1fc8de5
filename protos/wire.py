"""Hand-rolled protobuf encoding for xDS responses built from pre-serialized resources.

The control plane serializes each resource (as a ``google.protobuf.Any``) once and shares
those bytes between every stream. These helpers frame them into ``DiscoveryResponse`` /
``DeltaDiscoveryResponse`` bytes without building or re-serializing protobuf messages.

Proto3 rules apply: empty scalar strings/bytes are omitted; elements of repeated fields are
always written; ``control_plane=None`` means "absent" (``b""`` is an empty, present message).
Fields are written in field-number order, as protobuf does. Field numbers are those of
``envoy.service.discovery.v3`` (checked against the descriptors in tests/unit/test_protos.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

_U64: Final = (1 << 64) - 1
_ONE_BYTE: Final = tuple(bytes((i,)) for i in range(0x80))
_MAX_FIELD: Final = (1 << 29) - 1
_LEN: Final = 2  # wire type "length-delimited"

# google.protobuf.Any
ANY_TYPE_URL: Final = 1
ANY_VALUE: Final = 2
# envoy.service.discovery.v3.DiscoveryResponse
DR_VERSION_INFO: Final = 1
DR_RESOURCES: Final = 2
DR_TYPE_URL: Final = 4
DR_NONCE: Final = 5
DR_CONTROL_PLANE: Final = 6
# envoy.service.discovery.v3.DeltaDiscoveryResponse
DDR_SYSTEM_VERSION_INFO: Final = 1
DDR_RESOURCES: Final = 2
DDR_TYPE_URL: Final = 4
DDR_NONCE: Final = 5
DDR_REMOVED_RESOURCES: Final = 6
DDR_CONTROL_PLANE: Final = 7
# envoy.service.discovery.v3.DiscoveryRequest
DREQ_VERSION_INFO: Final = 1
DREQ_NODE: Final = 2
DREQ_RESOURCE_NAMES: Final = 3
DREQ_TYPE_URL: Final = 4
DREQ_RESPONSE_NONCE: Final = 5
# envoy.service.discovery.v3.Resource
RES_VERSION: Final = 1
RES_RESOURCE: Final = 2
RES_NAME: Final = 3


def varint(n: int) -> bytes:
    """Base-128 varint; negative numbers are encoded as 64-bit two's complement (int64)."""
    if 0 <= n < 0x80:
        return _ONE_BYTE[n]
    if n < 0:
        n &= _U64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def tag(field_number: int) -> bytes:
    """The key of a length-delimited field (field number and wire type)."""
    if not 1 <= field_number <= _MAX_FIELD:
        raise ValueError(f"invalid protobuf field number {field_number}")
    return varint((field_number << 3) | _LEN)


_T_ANY_TYPE_URL: Final = tag(ANY_TYPE_URL)
_T_ANY_VALUE: Final = tag(ANY_VALUE)
_T_DR_VERSION_INFO: Final = tag(DR_VERSION_INFO)
_T_DR_RESOURCES: Final = tag(DR_RESOURCES)
_T_DR_TYPE_URL: Final = tag(DR_TYPE_URL)
_T_DR_NONCE: Final = tag(DR_NONCE)
_T_DR_CONTROL_PLANE: Final = tag(DR_CONTROL_PLANE)
_T_DDR_SYSTEM_VERSION_INFO: Final = tag(DDR_SYSTEM_VERSION_INFO)
_T_DDR_RESOURCES: Final = tag(DDR_RESOURCES)
_T_DDR_TYPE_URL: Final = tag(DDR_TYPE_URL)
_T_DDR_NONCE: Final = tag(DDR_NONCE)
_T_DDR_REMOVED_RESOURCES: Final = tag(DDR_REMOVED_RESOURCES)
_T_DDR_CONTROL_PLANE: Final = tag(DDR_CONTROL_PLANE)
_T_RES_VERSION: Final = tag(RES_VERSION)
_T_RES_RESOURCE: Final = tag(RES_RESOURCE)
_T_RES_NAME: Final = tag(RES_NAME)
_T_DREQ_VERSION_INFO: Final = tag(DREQ_VERSION_INFO)
_T_DREQ_RESOURCE_NAMES: Final = tag(DREQ_RESOURCE_NAMES)
_T_DREQ_TYPE_URL: Final = tag(DREQ_TYPE_URL)
_T_DREQ_RESPONSE_NONCE: Final = tag(DREQ_RESPONSE_NONCE)


def _put(parts: list[bytes], tag: bytes, payload: bytes) -> None:
    parts += (tag, varint(len(payload)), payload)


def _put_str(parts: list[bytes], tag: bytes, s: str) -> None:
    """Append a singular string field, omitted when empty (proto3 default)."""
    if s:
        b = s.encode()
        parts += (tag, varint(len(b)), b)


def _put_repeated(parts: list[bytes], tag: bytes, payloads: Iterable[bytes]) -> None:
    for p in payloads:
        parts += (tag, varint(len(p)), p)


def any_bytes(type_url: str, value: bytes) -> bytes:
    """A serialized ``google.protobuf.Any``."""
    parts: list[bytes] = []
    _put_str(parts, _T_ANY_TYPE_URL, type_url)
    if value:
        _put(parts, _T_ANY_VALUE, value)
    return b"".join(parts)


def resources_block(resources: Iterable[bytes]) -> bytes:
    """The encoded ``DiscoveryResponse.resources`` field for serialized ``Any`` payloads.

    Many streams receive the same resources with different nonces: encode this block once
    and reuse it with ``discovery_response_block``.
    """
    parts: list[bytes] = []
    _put_repeated(parts, _T_DR_RESOURCES, resources)
    return b"".join(parts)


def discovery_response_block(
    version_info: str,
    block: bytes,
    type_url: str,
    nonce: str,
    control_plane: bytes | None = None,
) -> bytes:
    """A serialized ``DiscoveryResponse`` around a block from ``resources_block``."""
    parts: list[bytes] = []
    _put_str(parts, _T_DR_VERSION_INFO, version_info)
    parts.append(block)
    _put_str(parts, _T_DR_TYPE_URL, type_url)
    _put_str(parts, _T_DR_NONCE, nonce)
    if control_plane is not None:
        _put(parts, _T_DR_CONTROL_PLANE, control_plane)
    return b"".join(parts)


def delta_resource(name: str, version: str, any_payload: bytes) -> bytes:
    """A serialized delta ``Resource``; an empty any_payload leaves ``resource`` unset."""
    parts: list[bytes] = []
    _put_str(parts, _T_RES_VERSION, version)
    if any_payload:
        _put(parts, _T_RES_RESOURCE, any_payload)
    _put_str(parts, _T_RES_NAME, name)
    return b"".join(parts)


def delta_resource_field(name: str, version: str, any_payload: bytes) -> bytes:
    """One element of ``DeltaDiscoveryResponse.resources``, tag and length included: a
    response's resources are such elements joined (``delta_discovery_response_block``)."""
    payload = delta_resource(name, version, any_payload)
    return b"".join((_T_DDR_RESOURCES, varint(len(payload)), payload))


def delta_discovery_response_block(
    system_version_info: str,
    block: bytes,
    type_url: str,
    removed_resources: Iterable[str],
    nonce: str,
    control_plane: bytes | None = None,
) -> bytes:
    """A serialized ``DeltaDiscoveryResponse`` around an encoded ``resources`` field (elements
    from ``delta_resource_field``, joined)."""
    if isinstance(removed_resources, str):
        raise TypeError("removed_resources must be a collection of names, not a str")
    parts: list[bytes] = []
    _put_str(parts, _T_DDR_SYSTEM_VERSION_INFO, system_version_info)
    parts.append(block)
    _put_str(parts, _T_DDR_TYPE_URL, type_url)
    _put_str(parts, _T_DDR_NONCE, nonce)
    _put_repeated(parts, _T_DDR_REMOVED_RESOURCES, (n.encode() for n in removed_resources))
    if control_plane is not None:
        _put(parts, _T_DDR_CONTROL_PLANE, control_plane)
    return b"".join(parts)


def request_names(names: Iterable[str]) -> bytes:
    """``DiscoveryRequest.resource_names`` as a serializer writes it: the bytes that
    ``request_names_match`` looks for."""
    parts: list[bytes] = []
    _put_repeated(parts, _T_DREQ_RESOURCE_NAMES, (n.encode() for n in names))
    return b"".join(parts)


def request_ack(version_info: str, type_url: str, nonce: str) -> tuple[bytes, bytes]:
    """A serialized ``DiscoveryRequest`` that ACKs a response and carries nothing else (no
    node, no names, no error), in two parts: the fields before ``resource_names`` and those
    after it. For ``is_ack``."""
    head: list[bytes] = []
    _put_str(head, _T_DREQ_VERSION_INFO, version_info)
    tail: list[bytes] = []
    _put_str(tail, _T_DREQ_TYPE_URL, type_url)
    _put_str(tail, _T_DREQ_RESPONSE_NONCE, nonce)
    return b"".join(head), b"".join(tail)


def is_ack(raw: bytes, ack: tuple[bytes, bytes], names: bytes) -> bool:
    """Whether the serialized DiscoveryRequest `raw` is exactly the ACK `ack`
    (``request_ack``) naming the resources `names` (``request_names``), told by comparing
    bytes: no field is parsed and nothing is copied. Two layouts match, as for
    ``request_names_match``: fields in number order (Envoy: the names between the version
    and the type), or the names appended after the rest (the load tool). Anything else
    (another layout, a node, an error, other names) is False, and the caller decodes."""
    head, tail = ack
    at = len(head)
    if len(raw) != at + len(tail) + len(names) or not raw.startswith(head):
        return False
    if raw.startswith(names, at):
        return raw.endswith(tail)
    return raw.startswith(tail, at) and raw.endswith(names)


def request_names_match(raw: bytes, names: bytes) -> bool:
    """Whether the serialized DiscoveryRequest `raw` names exactly the resources `names`
    encodes (``request_names``), in that order, checked on its bytes without making a
    string of each name.

    True when `raw` is `names` with whole fields before and after it, none of them a
    resource name: repeated fields append in the order they come, so the names are then
    exactly these. Serializers write fields in number order (Envoy) or append the names to
    the rest (the load tool); either matches. Otherwise (a name elsewhere, names split up,
    malformed bytes) False, and the caller reads the names the slow way."""
    end = len(raw)
    at = _first_name(raw, 0, end)
    if at == end:  # no name in it
        return not names
    if at < 0 or not names or not raw.startswith(names, at):
        return False
    return _first_name(raw, at + len(names), end) == end


def first_request_name(raw: bytes) -> int:
    """Where the first ``resource_names`` field of the serialized DiscoveryRequest `raw`
    starts: ``len(raw)`` when it has none, -1 when `raw` is not whole fields."""
    return _first_name(raw, 0, len(raw))


def without_request_names(raw: bytes, at: int, names: bytes) -> bytes | None:
    """`raw` with the resource names `names` (non-empty, from ``request_names``) cut out,
    when they are exactly its names and start at `at` (``first_request_name``); else None.

    What is left decodes as the request without its names, and decoding that is a fraction
    of decoding the whole: every name would become a string (an EDS ACK names every cluster
    the proxy uses)."""
    if at < 0 or not names or not raw.startswith(names, at):
        return None
    after = at + len(names)
    end = len(raw)
    if _first_name(raw, after, end) != end:
        return None
    return raw[:at] + raw[after:]


def _first_name(raw: bytes, i: int, end: int) -> int:
    """Where the first DiscoveryRequest.resource_names field of raw[i:end] starts: `end` when
    it is whole fields without one, -1 when it is not whole fields."""
    try:
        while i < end:
            key = raw[i]
            if key == _NAMES_KEY:
                return i
            # A one-byte key of a length-delimited field shorter than 128 bytes (every field
            # of an ACK but the names and the node): skipped without the general varint
            # reader, which costs a call per varint, and an ACK is scanned on each push.
            if key < 0x80 and key & 7 == _LEN and i + 1 < end and raw[i + 1] < 0x80:
                i += 2 + raw[i + 1]
                continue
            start = i
            key, i = _read_varint(raw, i)
            if key >> 3 == DREQ_RESOURCE_NAMES:
                return start
            i = _past_field(raw, i, key & 7)
    except ValueError:
        return -1
    return end if i == end else -1


# The one-byte key of DiscoveryRequest.resource_names (field 3, length-delimited).
_NAMES_KEY: Final = (DREQ_RESOURCE_NAMES << 3) | _LEN


def scan_strings(data: bytes, wanted: frozenset[int]) -> dict[int, str]:
    """Top-level string fields of a serialized message, without decoding the rest.

    The agent routes responses by type URL and ACKs them by nonce; reading those two fields
    this way lets it forward a multi-megabyte CDS response without parsing its resources.
    Raises ValueError on malformed input.
    """
    out: dict[int, str] = {}
    i, n = 0, len(data)
    while i < n:
        key, i = _read_varint(data, i)
        number, wire_type = key >> 3, key & 7
        if wire_type == _LEN:
            length, i = _read_varint(data, i)
            end = i + length
            if end > n:
                raise ValueError("truncated length-delimited field")
            if number in wanted:
                out[number] = data[i:end].decode()
            i = end
        else:
            i = _past_field(data, i, wire_type)
    if i > n:
        raise ValueError("truncated field")
    return out


def _past_field(data: bytes, i: int, wire_type: int) -> int:
    """Where a field ends whose key ends at `i`; ValueError for groups and unknown types."""
    if wire_type == _LEN:
        length, i = _read_varint(data, i)
        return i + length
    if wire_type == 0:
        return _read_varint(data, i)[1]
    if wire_type == 1:
        return i + 8
    if wire_type == 5:
        return i + 4
    raise ValueError(f"unsupported wire type {wire_type}")


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if i >= len(data):
            raise ValueError("truncated varint")
        b = data[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")
