"""How generated messages are embedded in one another: Any packing with deterministic bytes (equal
inputs must give equal cached bytes) and the ADS config source every xDS reference points at.
"""

from __future__ import annotations

from envoy.config.core.v3.config_source_pb2 import (
    AggregatedConfigSource,
    ApiVersion,
    ConfigSource,
)
from google.protobuf.any_pb2 import Any as AnyProto
from google.protobuf.message import Message


def pack(message: Message) -> AnyProto:
    """Wrap a message in an Any with deterministic bytes: the enclosing resource is serialized
    deterministically, but Any.value is opaque to that and must be made so here."""
    packed = AnyProto()
    packed.Pack(message, deterministic=True)
    return packed


def ads_config_source() -> ConfigSource:
    return ConfigSource(ads=AggregatedConfigSource(), resource_api_version=ApiVersion.V3)
