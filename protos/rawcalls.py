"""gRPC methods whose requests reach the service as bytes, for it to decode (`bytes_in`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:
    from google.protobuf.message import Message


def bytes_in(
    kind: Callable[..., grpc.RpcMethodHandler],
    behaviour: Callable[..., Any],
    response: type[Message],
) -> grpc.RpcMethodHandler:
    """The method handler `kind` (grpc.unary_unary_rpc_method_handler, …) for `behaviour`,
    which receives each request as bytes and decodes it itself; its responses are `response`
    messages, serialized by gRPC.

    Decoded by the service, a request protobuf cannot parse (nested past its depth limit,
    say) ends that call with the caller's INVALID_ARGUMENT. With a generated deserializer its
    DecodeError escapes into gRPC instead: a unary call gets UNKNOWN and a traceback is
    logged, a stream ends with OK and an unretrieved task exception."""
    return kind(
        behaviour, request_deserializer=None, response_serializer=response.SerializeToString
    )
