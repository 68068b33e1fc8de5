"""Fuzzing a running control plane's config directory: a real `pilotfish-control` process
watches a directory; hypothesis rewrites one of its files with mutated manifests (broken YAML,
invalid fields, valid variations) while a simulated Envoy holds an ADS stream.

For each version of the file, the expected outcome is computed in the test with the same
loader (load, merge) and generators:

- a file that fails to load is reported in /debug/configz with exactly the loader's one-line
  `file:line: reason`, and nothing else changes: no reload, and the client's clusters stay
  those of the last good version (DESIGN: the last good config keeps being served);
- a file that loads replaces the last good version: the client's outbound clusters become
  what the generators make of it;
- the control plane's log never holds a traceback, and every rejected version that changed
  the file's error is logged as that one line.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest, DiscoveryResponse
from hypothesis import assume, event, given
from hypothesis import strategies as st

from control.config.errors import ConfigError, DuplicateObjectError
from control.config.loader import load_bytes
from control.config.merge import merge
from control.config.objects import FileConfig
from control.generate import GENERATORS
from control.generate.context import GenContext
from control.generate.resource_names import CLUSTER_TYPE
from control.model.index import MeshIndex
from control.model.proxy import proxy_from_node
from control.model.types import MeshConfig
from control.xds.cache import ResourceCache
from protos import typeurls
from tests.support.adsclient import SOTW, cluster_names
from tests.support.configfuzz import CORPUS, dump, mutated_docs, mutated_text
from tests.support.controlproc import ControlProcess
from tests.support.fuzz import fuzz_settings
from tests.support.net import pod_ip

BASE = """\
apiVersion: v1
kind: Service
metadata: {name: anchor, namespace: fuzz-base}
spec:
  selector: {app: anchor}
  ports: [{name: http, port: 7000}]
"""
WAIT = 20.0


def wait_for(check: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class Follower:
    """A simulated Envoy on a sync gRPC stream: subscribes to every cluster, ACKs each
    response, and keeps the newest cluster names (a reader thread)."""

    def __init__(self, target: str, node: str) -> None:
        self.channel = grpc.insecure_channel(target)
        self._requests: queue.Queue[DiscoveryRequest | None] = queue.Queue()
        first = DiscoveryRequest(type_url=typeurls.CLUSTER)
        first.node.id = node
        self._requests.put(first)
        self.call = self.channel.stream_stream(
            SOTW,
            request_serializer=DiscoveryRequest.SerializeToString,
            response_deserializer=DiscoveryResponse.FromString,
        )(iter(self._requests.get, None))
        self.clusters: set[str] | None = None
        self.responses = 0
        self.error: grpc.RpcError | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for resp in self.call:
                self.clusters = set(cluster_names(resp))
                self.responses += 1
                self._requests.put(
                    DiscoveryRequest(
                        type_url=resp.type_url,
                        version_info=resp.version_info,
                        response_nonce=resp.nonce,
                    )
                )
        except grpc.RpcError as e:
            self.error = e

    def outbound(self) -> set[str] | None:
        if self.clusters is None:
            return None
        return {c for c in self.clusters if c.startswith("outbound|")}

    def close(self) -> None:
        self._requests.put(None)
        self.call.cancel()
        self._thread.join(10)
        self.channel.close()


class Live:
    def __init__(self, cfg: Path, cp: ControlProcess, follower: Follower, node: str) -> None:
        self.cfg = cfg
        self.cp = cp
        self.follower = follower
        self.path = str(cfg / "fuzz.yaml")
        self.base = load_bytes(BASE.encode(), str(cfg / "base.yaml"))
        self.proxy = proxy_from_node(node, {})
        self.good: MeshConfig | None = None  # the merged config the server must be serving
        self.counter = itertools.count(1)
        self.logged: list[str] = []  # rejections whose one-line error must be in the log
        self.last_error = ""

    def configz(self) -> dict[str, Any]:
        status, body = self.cp.http("/debug/configz")
        assert status == 200, status
        return dict(json.loads(body))

    def outbound_of(self, mesh: MeshConfig) -> set[str]:
        ctx = GenContext(MeshIndex(mesh, ()), ResourceCache())
        return {n for n in GENERATORS[CLUSTER_TYPE](ctx, self.proxy) if n.startswith("outbound|")}

    def write(self, data: bytes) -> None:
        tmp = self.cfg / ".fuzz.tmp"  # hidden: the watcher skips it
        tmp.write_bytes(data)
        os.replace(tmp, self.path)  # whole versions only, as editors and ConfigMaps do


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    root = tmp_path_factory.mktemp("fuzzlive")
    cfg = root / "cfg"
    cfg.mkdir()
    (cfg / "base.yaml").write_text(BASE)
    (cfg / "fuzz.yaml").write_text(CORPUS["service"])
    cp = ControlProcess(cfg, root / "state", root / "control.log")
    cp.start()
    follower: Follower | None = None
    try:
        wait_for(cp.ready, "control plane ready", 30)
        node = f"sidecar~{pod_ip()}~follower.client~client.svc.cluster.local"
        follower = Follower(cp.target, node)
        state = Live(cfg, cp, follower, node)
        fc = load_bytes(CORPUS["service"].encode(), state.path)
        state.good = merge([state.base, fc])
        want = state.outbound_of(state.good)
        wait_for(lambda: follower.outbound() == want, "the first clusters")  # type: ignore[union-attr]
        yield state
        log = cp.log()
        assert "Traceback" not in log, log[-4000:]
        missing = [line for line in state.logged if line not in log]
        assert not missing, missing
        assert follower.error is None, follower.error
    finally:
        if follower is not None:
            follower.close()
        cp.terminate()


def expectation(live: Live, data: bytes) -> tuple[str, ConfigError | MeshConfig]:
    """What the server must make of this version of the file."""
    try:
        fc: FileConfig = load_bytes(data, live.path)
    except ConfigError as e:
        return "refused", e
    try:
        return "loaded", merge([live.base, fc])
    except DuplicateObjectError as e:
        return "duplicate", e


texts = st.one_of(mutated_text(), mutated_docs().map(dump), st.sampled_from(list(CORPUS.values())))


@fuzz_settings(25)
@given(text=texts)
def test_the_live_control_plane_keeps_its_last_good_config(live: Live, text: str) -> None:
    # A fresh first line: every example is a new version of the file (same content twice
    # would not be noticed, by design).
    data = f"# fuzz example {next(live.counter)}\n{text}".encode("utf-8", "surrogatepass")
    kind, expected = expectation(live, data)
    assume(kind != "duplicate")  # colliding with base.yaml: another file's story
    event(kind)
    before = live.configz()["source"]
    live.write(data)
    if isinstance(expected, ConfigError):
        message = str(expected)

        def rejected() -> bool:
            source = live.configz()["source"]
            return bool(
                source["failed_loads"] > before["failed_loads"]
                and source["errors"].get(live.path) == message
            )

        wait_for(rejected, f"rejection: {message}")
        assert live.configz()["source"]["reloads"] == before["reloads"], "a broken file reloaded"
        if message != live.last_error:
            live.logged.append(f"{message} (keeping its last good version)")
        live.last_error = message
    else:
        assert live.good is not None
        if expected != live.good:
            wait_for(lambda: live.configz()["source"]["reloads"] > before["reloads"], "reload")
        elif live.path in before["errors"]:
            wait_for(lambda: live.path not in live.configz()["source"]["errors"], "valid again")
        live.good = expected
        live.last_error = ""
    want = live.outbound_of(live.good)
    wait_for(lambda: live.follower.outbound() == want, f"clusters {sorted(want)}")
