"""Single fields and whole xDS responses in one call, for tests and benchmarks.

The control plane frames cached resource blocks (`protos.wire.*_block`); a test that has a
handful of serialized resources wants the response from them directly.
"""

from __future__ import annotations

from collections.abc import Iterable

from protos import wire


def field_bytes(field_number: int, payload: bytes) -> bytes:
    """One length-delimited field (always written, even when payload is empty)."""
    return b"".join((wire.tag(field_number), wire.varint(len(payload)), payload))


def field_string(field_number: int, s: str) -> bytes:
    """One UTF-8 string field (always written, even when s is empty)."""
    return field_bytes(field_number, s.encode())


def discovery_response(
    version_info: str,
    resources: Iterable[bytes],
    type_url: str,
    nonce: str,
    control_plane: bytes | None = None,
) -> bytes:
    """A serialized ``DiscoveryResponse``; each resource is a serialized ``Any``."""
    return wire.discovery_response_block(
        version_info, wire.resources_block(resources), type_url, nonce, control_plane
    )


def delta_discovery_response(
    system_version_info: str,
    resources: Iterable[bytes],
    type_url: str,
    removed_resources: Iterable[str],
    nonce: str,
    control_plane: bytes | None = None,
) -> bytes:
    """A serialized ``DeltaDiscoveryResponse``; each resource is a serialized ``Resource``."""
    block = b"".join(field_bytes(wire.DDR_RESOURCES, r) for r in resources)
    return wire.delta_discovery_response_block(
        system_version_info, block, type_url, removed_resources, nonce, control_plane
    )
