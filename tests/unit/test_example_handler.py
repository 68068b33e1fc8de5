"""The shipped example handler does what its docstring says."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from envoy.config.listener.v3.listener_pb2 import Listener
from google.protobuf import any_pb2

from agent.xdsproxy.handlers import HandlerError, HandlerRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "handlers"))
import listener_names


def packed(*names: str) -> list[any_pb2.Any]:
    out = []
    for n in names:
        a = any_pb2.Any()
        a.Pack(Listener(name=n))
        out.append(a)
    return out


def test_example_handler_records_and_rejects() -> None:
    registry = HandlerRegistry()
    listener_names.setup(registry)
    asyncio.run(registry.dispatch(listener_names.LISTENER, packed("b_80", "a_80")))
    assert listener_names.latest == ["a_80", "b_80"]
    with pytest.raises(HandlerError, match="no listeners for this pod"):
        asyncio.run(registry.dispatch(listener_names.LISTENER, []))
