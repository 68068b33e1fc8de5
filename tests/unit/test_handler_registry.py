"""HandlerRegistry without sockets: registration (types, modes, plug-ins), consume (decode,
NACK reasons, counts), observe (after the fact, errors counted, a full queue drops)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.core.v3.extension_pb2 import TypedExtensionConfig
from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryResponse, DiscoveryResponse
from google.protobuf import any_pb2, struct_pb2
from google.protobuf.message import Message

from agent.xdsproxy import handlers as handlers_mod
from agent.xdsproxy.handlers import (
    HandlerError,
    HandlerRegistry,
    PluginError,
    UnknownHandlerType,
)
from protos import typeurls

ECDS = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"
STRUCT = "type.googleapis.com/google.protobuf.Struct"


class Recorder:
    """A HandlerObserver that keeps what it was told."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def handled(self, handler: str, type_url: str, seconds: float) -> None:
        assert seconds >= 0
        self.events.append(("handled", handler, type_url))

    def rejected(self, handler: str, type_url: str) -> None:
        self.events.append(("rejected", handler, type_url))

    def observe_error(self, handler: str, type_url: str) -> None:
        self.events.append(("observe_error", handler, type_url))

    def observe_dropped(self, handler: str, type_url: str) -> None:
        self.events.append(("observe_dropped", handler, type_url))


def packed(*messages: Message) -> list[any_pb2.Any]:
    out = []
    for m in messages:
        a = any_pb2.Any()
        a.Pack(m)
        out.append(a)
    return out


def sotw(*messages: Message) -> bytes:
    resp = DiscoveryResponse(type_url=typeurls.CLUSTER, version_info="1", nonce="n")
    resp.resources.extend(packed(*messages))
    data: bytes = resp.SerializeToString()
    return data


def test_register_resolves_the_class_and_rejects_unknown_types_by_name() -> None:
    r = HandlerRegistry()
    r.register(ECDS, lambda rs: None)
    assert r.registrations()[0].message_class is TypedExtensionConfig
    with pytest.raises(UnknownHandlerType, match=r"envoy\.config\.cluster\.v3\.Clustr"):
        r.register("type.googleapis.com/envoy.config.cluster.v3.Clustr", lambda rs: None)
    assert "type.googleapis.com/envoy.config.cluster.v3.Clustr" not in r
    with pytest.raises(ValueError, match="already registered"):
        r.register(ECDS, lambda rs: None)
    with pytest.raises(ValueError, match="mode must be one of consume, observe"):
        r.register(STRUCT, lambda rs: None, mode="mirror")  # type: ignore[arg-type]


def test_a_plug_in_type_brings_its_class() -> None:
    r = HandlerRegistry()
    seen: list[Sequence[Message]] = []
    r.register("type.googleapis.com/example.Thing", seen.append, message_class=struct_pb2.Struct)
    thing = any_pb2.Any(type_url="type.googleapis.com/example.Thing")
    thing.value = struct_pb2.Struct(
        fields={"a": struct_pb2.Value(string_value="b")}
    ).SerializeToString()
    asyncio.run(r.dispatch("type.googleapis.com/example.Thing", [thing]))
    assert isinstance(seen[0][0], struct_pb2.Struct)
    assert seen[0][0]["a"] == "b"


def test_modes_split_consumed_from_observed_types() -> None:
    r = HandlerRegistry()
    r.register(typeurls.LISTENER, lambda rs: None)
    r.register(typeurls.CLUSTER, lambda rs: None, mode="observe")
    assert r.consumes(typeurls.LISTENER) and not r.observes(typeurls.LISTENER)
    assert r.observes(typeurls.CLUSTER) and not r.consumes(typeurls.CLUSTER)
    # The agent stream subscribes to consumed types only.
    assert r.type_urls == [typeurls.LISTENER]
    r.unregister(typeurls.CLUSTER)
    assert not r.observes(typeurls.CLUSTER)


def test_consume_decodes_counts_and_turns_errors_into_nack_reasons() -> None:
    rec = Recorder()
    r = HandlerRegistry(observer=rec)
    got: list[list[str]] = []

    async def handler(resources: Sequence[Cluster]) -> None:
        got.append([c.name for c in resources])
        if not resources:
            raise ValueError("no clusters")

    r.register(typeurls.CLUSTER, handler)  # type: ignore[arg-type]
    name = r.registrations()[0].name
    assert name.endswith("handler")
    asyncio.run(r.dispatch(typeurls.CLUSTER, packed(Cluster(name="a"), Cluster(name="b"))))
    assert got == [["a", "b"]]
    with pytest.raises(HandlerError, match=r"^ValueError: no clusters$"):
        asyncio.run(r.dispatch(typeurls.CLUSTER, []))
    # A resource of another type in the response is a NACK, and is not decoded as one.
    with pytest.raises(HandlerError, match=r"resource of type .*Struct"):
        asyncio.run(r.dispatch(typeurls.CLUSTER, packed(struct_pb2.Struct())))
    bad = any_pb2.Any(type_url=typeurls.CLUSTER, value=b"\xff\xff")
    with pytest.raises(HandlerError, match="cannot decode"):
        asyncio.run(r.dispatch(typeurls.CLUSTER, [bad]))
    counts = r.counts[typeurls.CLUSTER]
    assert (counts.handled, counts.nacks) == (4, 3)
    assert rec.events.count(("handled", name, typeurls.CLUSTER)) == 4
    assert rec.events.count(("rejected", name, typeurls.CLUSTER)) == 3


async def test_observe_runs_after_the_fact_and_never_raises() -> None:
    rec = Recorder()
    r = HandlerRegistry(observer=rec)
    seen: list[list[str]] = []

    def observer(resources: Sequence[Cluster]) -> None:
        seen.append([c.name for c in resources])
        if len(resources) > 1:
            raise RuntimeError("too many")

    r.register(typeurls.CLUSTER, observer, mode="observe")  # type: ignore[arg-type]
    r.observe(typeurls.CLUSTER, sotw(Cluster(name="a")), delta=False)
    assert seen == []  # queued: the relay is not held up by the call
    r.observe(typeurls.CLUSTER, sotw(Cluster(name="a"), Cluster(name="b")), delta=False)
    delta = DeltaDiscoveryResponse(type_url=typeurls.CLUSTER, nonce="d")
    delta.resources.add(name="c").resource.Pack(Cluster(name="c"))
    delta.removed_resources.append("a")
    r.observe(typeurls.CLUSTER, delta.SerializeToString(), delta=True)
    r.observe(typeurls.CLUSTER, b"\xff\xff", delta=False)  # undecodable: an observe error
    await r.drain_observers()
    assert seen == [["a"], ["a", "b"], ["c"]]
    counts = r.counts[typeurls.CLUSTER]
    assert (counts.handled, counts.observe_errors, counts.nacks) == (4, 2, 0)
    assert [e[0] for e in rec.events].count("observe_error") == 2
    await r.close()


async def test_a_slow_observer_drops_responses_instead_of_queueing_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(handlers_mod, "OBSERVE_QUEUE", 2)
    release = asyncio.Event()
    seen: list[int] = []

    async def slow(resources: Sequence[Message]) -> None:
        seen.append(len(resources))
        await release.wait()

    rec = Recorder()
    r = HandlerRegistry(observer=rec)
    r.register(typeurls.CLUSTER, slow, mode="observe")
    for _ in range(6):
        r.observe(typeurls.CLUSTER, sotw(Cluster(name="a")), delta=False)
    await asyncio.sleep(0)  # the worker takes one; the queue holds two more
    r.observe(typeurls.CLUSTER, sotw(Cluster(name="a")), delta=False)
    release.set()
    await r.drain_observers()
    counts = r.counts[typeurls.CLUSTER]
    assert counts.observe_dropped == 7 - len(seen)
    assert counts.observe_dropped >= 3
    assert [e[0] for e in rec.events].count("observe_dropped") == counts.observe_dropped
    await r.close()


def _dist(tmp_path: Path, dist: str, module: str, body: str, entry: str) -> None:
    (tmp_path / f"{module}.py").write_text(body)
    info = tmp_path / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[pf.test.handlers]\n{entry} = {module}:setup\n")


def test_plug_ins_are_named_skipped_when_broken_and_fatal_for_unknown_types(
    tmp_path: Path,
) -> None:
    _dist(
        tmp_path,
        "pf-good",
        "pf_good_plugin",
        "def setup(registry):\n"
        "    registry.register('type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig',"
        " print, mode='observe')\n",
        "good",
    )
    _dist(
        tmp_path,
        "pf-half",
        "pf_half_plugin",
        "def setup(registry):\n"
        "    registry.register('type.googleapis.com/google.protobuf.Struct', print)\n"
        "    raise RuntimeError('half way')\n",
        "half",
    )
    sys.path.insert(0, str(tmp_path))
    try:
        r = HandlerRegistry()
        assert r.load_entry_points("pf.test.handlers") == ["good"]
        assert [(g.name, g.package, g.mode) for g in r.registrations()] == [
            ("good", "pf-good", "observe")
        ]
        # What the failed plug-in registered before failing was taken back.
        assert STRUCT not in r
        described = r.describe()
        assert described[0]["package"] == "pf-good"
        assert described[0]["message"] == "envoy.config.core.v3.TypedExtensionConfig"

        _dist(
            tmp_path,
            "pf-bad",
            "pf_bad_plugin",
            "def setup(registry):\n"
            "    registry.register('type.googleapis.com/envoy.config.cluster.v3.NoSuch', print)\n",
            "bad-types",
        )
        with pytest.raises(PluginError) as e:
            HandlerRegistry().load_entry_points("pf.test.handlers")
        message = str(e.value)
        assert "handler plug-in bad-types (pf-bad)" in message
        assert "envoy.config.cluster.v3.NoSuch" in message
        assert "\n" not in message
    finally:
        sys.path.remove(str(tmp_path))


async def test_observers_queue_apart_and_big_responses_are_bounded_by_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    big = sotw(*(Cluster(name=f"c{i}") for i in range(100)))
    monkeypatch.setattr(handlers_mod, "OBSERVE_QUEUE_BYTES", len(big) * 2)
    release = asyncio.Event()

    async def stuck(resources: Sequence[Message]) -> None:
        await release.wait()

    listeners: list[int] = []
    r = HandlerRegistry()
    r.register(typeurls.CLUSTER, stuck, mode="observe")
    r.register(typeurls.LISTENER, lambda rs: listeners.append(len(rs)), mode="observe")
    for _ in range(4):
        r.observe(typeurls.CLUSTER, big, delta=False)
    # Two fit the byte budget; the stuck CDS observer does not hold up the LDS one.
    assert r.counts[typeurls.CLUSTER].observe_dropped == 2
    listener = DiscoveryResponse(type_url=typeurls.LISTENER)
    r.observe(typeurls.LISTENER, listener.SerializeToString(), delta=False)
    for _ in range(100):
        if listeners:
            break
        await asyncio.sleep(0.01)
    assert listeners == [0]
    release.set()
    await r.drain_observers()
    assert r.counts[typeurls.CLUSTER].handled == 2
    await r.close()
