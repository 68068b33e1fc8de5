"""How the ADS server is tuned: its options and the gRPC server options that let it take
thousands of streams at once. Kept apart from the server so that the wiring (control/app.py)
can build the gRPC server from the same options without importing the stream machinery.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from control.xds.admission import AdmissionLimits


@dataclass(frozen=True, slots=True)
class XdsOptions:
    control_plane_id: str = "pilotfish"
    max_concurrent_pushes: int = 100
    # How fast new streams are admitted (adaptive: control/xds/admission.py).
    admission: AdmissionLimits = field(default_factory=AdmissionLimits)
    send_timeout: float = 30.0  # a stream that cannot take a response this long is closed
    # New streams gRPC holds until our handler takes them; beyond this many it refuses them
    # (see grpc_stream_options).
    max_pending_streams: int = 50_000
    # Most a connection's read buffer stays at after a burst of requests (see
    # grpc_stream_options).
    max_read_buffer: int = 16 << 10
    # Freed memory goes back to the system (the server's `trim`) `trim_idle` seconds after
    # the send queue drains, once this many streams were opened since the last time: after
    # a connection storm, not after pushes (see control/xds/trim.py). 0: never.
    trim_after_streams: int = 500
    trim_idle: float = 1.0
    # A connection that has not finished its handshake (TLS, then the HTTP/2 preface and
    # SETTINGS) this many seconds after it was accepted is closed (see grpc_stream_options).
    handshake_timeout: float = 20.0


def grpc_stream_options(options: XdsOptions) -> list[tuple[str, int]]:
    """gRPC server options for taking thousands of streams at once.

    The grpc.aio server takes incoming calls from gRPC core one per event-loop iteration, and
    core refuses calls that wait to be taken beyond a backlog (by default, at random from
    1,000 waiting and all from 3,000; the client sees CANCELLED). In a connection storm the
    loop is busy answering the streams it already has, the backlog passes 1,000 and proxies
    get errors instead of waiting their turn. Waiting calls cost a few hundred bytes in core;
    the expensive part of a new stream starts after our own admission (rule 9,
    control/xds/admission.py), which paces them. So the backlog is bounded only against a flood.

    Each connection's socket reads into buffers gRPC allocates ahead, sized by how much the
    last reads brought: a burst (a new Envoy's first requests, an EDS subscription naming a
    thousand clusters; a SotW EDS ACK names them all again) grows that size, it shrinks by 1%
    per read afterwards, and the unused part stays allocated between reads. Measured on 100
    streams per connection, that was 10-30 KB per stream kept for nothing once the storm was
    over (and with a connection per Envoy, as in a real mesh, it is per proxy). The clamp
    bounds what is allocated ahead: a larger request is read in more reads of this size
    (requests are small but for those bursts), and nothing changes on the wire.

    A connection that never completes its handshake costs a descriptor and ~11 KB in core
    until gRPC gives up on it, by default after 120 s: a peer opening thousands of silent
    connections holds that much for two minutes each. A real client (Envoy, gRPC, the agent)
    completes the handshake in milliseconds, so `handshake_timeout` bounds the hold to
    seconds without cutting a real client off."""
    return [
        ("grpc.max_concurrent_streams", 1 << 20),
        ("grpc.server.max_pending_requests", options.max_pending_streams),
        ("grpc.server.max_pending_requests_hard_limit", options.max_pending_streams),
        ("grpc.experimental.tcp_max_read_buffer_size", options.max_read_buffer),
        ("grpc.server_handshake_timeout_ms", round(options.handshake_timeout * 1000)),
    ]


def grpc_connection_options() -> list[tuple[str, int]]:
    """gRPC server options that make each connection cheaper, beyond the stream limits.

    Channelz (on by default in gRPC core) keeps a socket node per connection: the counters,
    addresses and a registry entry that only a channelz service can show, and we serve none.
    Off, a connected proxy costs about 0.5 KB less in gRPC core (mallinfo2, 500 proxies with
    a connection each: 37.3 -> 36.8 KB of malloc'd memory per proxy)."""
    return [("grpc.enable_channelz", 0)]
