"""The shipped example handler (examples/handlers) and the README's ResponseHandler snippet
do what they say (the end-to-end run of the example is tests/e2e/test_agent_handlers.py)."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryResponse

from agent.xdsproxy.handlers import HandlerError, HandlerRegistry
from protos import typeurls
from tests.unit.test_handler_registry import packed

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "handlers"))
import listener_audit


def test_example_observes_by_default_and_mirrors_every_response(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror = tmp_path / "audit.jsonl"
    monkeypatch.setenv("LISTENER_AUDIT_FILE", str(mirror))
    monkeypatch.delenv("LISTENER_AUDIT_MODE", raising=False)
    monkeypatch.setenv("LISTENER_AUDIT_REQUIRE", "a_80")
    registry = HandlerRegistry()
    listener_audit.setup(registry)
    assert registry.observes(listener_audit.LISTENER)

    async def run() -> None:
        # Two listeners, then a response without the required one.
        registry.observe(
            listener_audit.LISTENER,
            _sotw(Listener(name="b_80"), Listener(name="a_80")),
            delta=False,
        )
        registry.observe(listener_audit.LISTENER, _sotw(Listener(name="b_80")), delta=False)
        await registry.drain_observers()
        await registry.close()

    asyncio.run(run())
    lines = [json.loads(line) for line in mirror.read_text().splitlines()]
    assert lines == [
        {"mode": "observe", "listeners": ["a_80", "b_80"]},
        {"mode": "observe", "listeners": ["b_80"]},
    ]
    counts = registry.counts[listener_audit.LISTENER]
    assert (counts.observe_errors, counts.nacks) == (1, 0)  # the missing a_80: logged only


def _sotw(*listeners: Listener) -> bytes:
    resp = DiscoveryResponse(type_url=typeurls.LISTENER, nonce="n")
    resp.resources.extend(packed(*listeners))
    data: bytes = resp.SerializeToString()
    return data


def test_example_in_consume_mode_nacks_what_fails_its_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LISTENER_AUDIT_MODE", "consume")
    monkeypatch.delenv("LISTENER_AUDIT_REQUIRE", raising=False)
    monkeypatch.delenv("LISTENER_AUDIT_FILE", raising=False)
    registry = HandlerRegistry()
    listener_audit.setup(registry)
    assert registry.consumes(listener_audit.LISTENER)
    asyncio.run(registry.dispatch(listener_audit.LISTENER, packed(Listener(name="b_80"))))
    with pytest.raises(HandlerError, match="no listeners for this pod"):
        asyncio.run(registry.dispatch(listener_audit.LISTENER, []))
    monkeypatch.setenv("LISTENER_AUDIT_MODE", "mirror")
    with pytest.raises(ValueError, match="LISTENER_AUDIT_MODE must be observe or consume"):
        listener_audit.setup(HandlerRegistry())


def readme_snippet() -> str:
    """The first python code block of README.md's ResponseHandlers section."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### ResponseHandlers") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "README's ResponseHandlers section has no python block"
    return match.group(1)


def test_readme_snippet_runs_as_written() -> None:
    module = ModuleType("readme_snippet")
    exec(compile(readme_snippet(), "README.md:ResponseHandlers", "exec"), module.__dict__)
    registry = HandlerRegistry()
    module.setup(registry)
    assert registry.consumes(typeurls.LISTENER)
    assert registry.observes(typeurls.CLUSTER)
    asyncio.run(registry.dispatch(typeurls.LISTENER, packed(Listener(name="x"))))
    with pytest.raises(HandlerError, match="no listeners"):
        asyncio.run(registry.dispatch(typeurls.LISTENER, []))

    async def observe() -> None:
        resp = DiscoveryResponse(type_url=typeurls.CLUSTER)
        resp.resources.extend(packed(Cluster(name="c1"), Cluster(name="c2")))
        registry.observe(typeurls.CLUSTER, resp.SerializeToString(), delta=False)
        await registry.drain_observers()
        await registry.close()

    asyncio.run(observe())
    assert module.seen == {"c1": 1, "c2": 1}
    assert registry.counts[typeurls.CLUSTER].observe_errors == 0
