"""Interactive ADS fuzzing against the live server, SotW and delta: random request sequences
(type URLs, names, subscribe/unsubscribe, initial_resource_versions, nonces that were really
sent, stale or made up, NACKs with error_detail) on real gRPC streams, each request sent only
after the answer it must get has arrived, so every response can be attributed.

The config does not change during a run, so the client can state exactly what the server must
do (an oracle written from the xDS protocol and DESIGN's wire rules, not from the server):

- a request that must be answered (the first of a type, a new subscription, SotW without a
  nonce) gets exactly one response of its type; any other response is a rule 4 violation
  ("send only when something changed") and, after a NACK, a rule 2 violation;
- delta never re-sends a (name, version) the client NACKed while it still holds it (rule 2),
  and sends only subscribed names unless subscribed to everything;
- nonces are unique per stream;
- a stream ends only with INVALID_ARGUMENT, and only for bad input (no node on the first
  request, an empty type URL); otherwise it ends OK when the client half-closes;
- nothing is logged at ERROR (no unhandled exception, no gRPC batch failure).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from envoy.service.discovery.v3.discovery_pb2 import (
    DeltaDiscoveryRequest,
    DeltaDiscoveryResponse,
    DiscoveryRequest,
    DiscoveryResponse,
)
from hypothesis import event, example, given
from hypothesis import strategies as st

from protos import typeurls
from tests.support.adsclient import DELTA, SOTW, node_id
from tests.support.fuzz import ControlPlaneThread, ErrorLog, fuzz_settings
from tests.support.net import pod_ip

MESH = """\
apiVersion: v1
kind: Service
metadata: {name: alpha, namespace: default}
spec:
  selector: {app: alpha}
  ports: [{name: http, port: 9080, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: beta, namespace: default}
spec:
  selector: {app: beta}
  ports: [{name: grpc, port: 9090}]
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: alpha-1, namespace: default}
spec: {address: 10.0.0.1, labels: {app: alpha}}
"""

ALPHA = "outbound|9080||alpha.default.svc.cluster.local"
BETA = "outbound|9090||beta.default.svc.cluster.local"
VALID_TYPES = [
    typeurls.CLUSTER,
    typeurls.ENDPOINT,
    typeurls.LISTENER,
    typeurls.ROUTE,
    typeurls.DEBUG_SYNCZ,
    "type.googleapis.com/not.a.Type",
]
# An empty type URL ends the stream: rare enough that most sequences run to their end.
TYPES = [*VALID_TYPES * 5, ""]
NAMES = ["*", ALPHA, BETA, "9080", "nope", "", "\x00x", "é" * 40, "n" * 300]
ANSWER_TIMEOUT = 10.0


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneThread]:
    d = tmp_path_factory.mktemp("fuzzads")
    (d / "mesh.yaml").write_text(MESH)
    t = ControlPlaneThread(d)
    with ErrorLog() as errors:
        t.start()
        try:
            yield t
        finally:
            t.stop()
    assert not errors.records, errors.messages()


@pytest.fixture(scope="module")
def node() -> str:
    return node_id(pod_ip(), "fuzz")


class Stream:
    """One ADS stream driven step by step from the test's thread (sync gRPC: hypothesis
    drives plain functions)."""

    def __init__(self, target: str, *, delta: bool) -> None:
        self.channel = grpc.insecure_channel(target)
        self._requests: queue.Queue[Any] = queue.Queue()
        response = DeltaDiscoveryResponse if delta else DiscoveryResponse
        self.call = self.channel.stream_stream(
            DELTA if delta else SOTW,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response.FromString,
        )(iter(self._requests.get, None), timeout=60)
        self.responses: queue.Queue[Any] = queue.Queue()
        self.code: grpc.StatusCode | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for resp in self.call:
                self.responses.put(resp)
            self.code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            self.code = e.code()
        self.responses.put(None)

    def send(self, req: Any) -> None:
        self._requests.put(req)

    def next(self, timeout: float) -> Any:
        """The next response; None when the stream has ended; queue.Empty on timeout."""
        return self.responses.get(timeout=timeout)

    def pending(self) -> list[Any]:
        """Responses that arrived and were not taken yet (None marks the end)."""
        out = []
        while True:
            try:
                out.append(self.responses.get_nowait())
            except queue.Empty:
                return out

    def finish(self) -> list[Any]:
        """Half-close and collect what is left until the server ends the stream."""
        self._requests.put(None)
        rest = []
        while (resp := self.next(ANSWER_TIMEOUT)) is not None:
            rest.append(resp)
        self.responses.put(None)  # keep the end marker for later callers
        return rest

    def close(self) -> None:
        self._requests.put(None)
        self.call.cancel()
        self._reader.join(10)
        self.channel.close()


# --- the oracles -------------------------------------------------------------------------------


@dataclass
class SotwType:
    names: frozenset[str]
    legacy_wildcard: bool
    last_nonce: str = ""
    nonces: list[str] = field(default_factory=list)


class SotwOracle:
    """What a SotW server must answer, from the xDS protocol and wire rules 2-5."""

    def __init__(self) -> None:
        self.types: dict[str, SotwType] = {}

    def must_answer(self, req: DiscoveryRequest) -> bool:
        names = frozenset(req.resource_names)
        t = self.types.get(req.type_url)
        if t is None:
            self.types[req.type_url] = SotwType(names, legacy_wildcard=not names)
            return True
        if req.response_nonce and req.response_nonce != t.last_nonce:
            return False  # rule 3: stale, ignored entirely (subscription included)
        if not req.response_nonce:
            # A request without a nonce restarts the subscription: always answered.
            t.legacy_wildcard = t.legacy_wildcard and not names
            t.names = names
            return True
        added = names - t.names
        t.names = names
        if names:
            t.legacy_wildcard = False
        return bool(added)  # rules 2 and 4: a NACK or ACK is answered only for new names

    def on_response(self, resp: DiscoveryResponse) -> None:
        t = self.types[resp.type_url]
        t.last_nonce = resp.nonce
        t.nonces.append(resp.nonce)


@dataclass
class DeltaType:
    names: set[str] = field(default_factory=set)
    explicit_wildcard: bool = False
    legacy_wildcard: bool = False
    outstanding: set[str] = field(default_factory=set)
    nonces: list[str] = field(default_factory=list)
    sent: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # nonce -> resources
    nacked: set[tuple[str, str]] = field(default_factory=set)  # (name, version) refused

    @property
    def wildcard(self) -> bool:
        return self.explicit_wildcard or (self.legacy_wildcard and not self.names)

    def forget(self, dropped: Callable[[str], bool]) -> None:
        """The client no longer holds these names: what it NACKed of them, or NACKs later
        from a response it got before dropping them, no longer binds the server (asking for
        them again must bring them again)."""
        self.nacked = {(n, v) for n, v in self.nacked if not dropped(n)}
        self.sent = {k: [(n, v) for n, v in got if not dropped(n)] for k, got in self.sent.items()}


class DeltaOracle:
    """What a delta server must answer and must never send, from the xDS protocol (delta
    variant) and wire rules 2, 4, 5 and 7."""

    def __init__(self) -> None:
        self.types: dict[str, DeltaType] = {}

    def must_answer(self, req: DeltaDiscoveryRequest) -> bool:
        t = self.types.get(req.type_url)
        first = t is None
        if t is None:
            t = self.types[req.type_url] = DeltaType()
            t.legacy_wildcard = not req.resource_names_subscribe
        elif req.response_nonce in t.outstanding:
            t.outstanding.discard(req.response_nonce)
            if req.HasField("error_detail"):
                t.nacked |= set(t.sent.get(req.response_nonce, ()))
        subscribe = set(req.resource_names_subscribe)
        unsubscribe = set(req.resource_names_unsubscribe)
        was_wildcard = t.wildcard
        if "*" in subscribe:
            t.explicit_wildcard = True
        if "*" in unsubscribe:
            t.explicit_wildcard = t.legacy_wildcard = False
        subscribe.discard("*")
        unsubscribe.discard("*")
        added = subscribe - t.names
        t.names = (t.names | subscribe) - unsubscribe
        if subscribe:
            t.legacy_wildcard = False
        # The client drops what it unsubscribes from (and, leaving the wildcard, everything it
        # held only through it): the server may send those again if they are asked for again.
        t.forget(unsubscribe.__contains__)
        if "*" in req.resource_names_unsubscribe and not t.wildcard:
            names = set(t.names)
            t.forget(lambda n: n not in names)
        return first or bool(added) or (t.wildcard and not was_wildcard)

    def on_response(self, resp: DeltaDiscoveryResponse) -> None:
        t = self.types[resp.type_url]
        got = [(r.name, r.version) for r in resp.resources]
        again = [pair for pair in got if pair in t.nacked]
        assert not again, f"rule 2: re-sent NACKed resources {again} of {resp.type_url}"
        if not t.wildcard:
            extra = {name for name, _ in got} - t.names
            assert not extra, f"sent unsubscribed {extra} of {resp.type_url}"
        t.forget(set(resp.removed_resources).__contains__)
        t.outstanding.add(resp.nonce)
        t.sent[resp.nonce] = got
        t.nonces.append(resp.nonce)


# --- strategies --------------------------------------------------------------------------------

# Which nonce a request carries: none, the last one received for its type, an older one, one
# of another type, or made up.
NONCES = ["none", "last", "last", "last", "older", "other-type", "made-up"]
names = st.lists(st.sampled_from(NAMES), max_size=3)
errors = st.sampled_from(["", "", "bad config", "é" * 50, "\x00"])

sotw_steps = st.lists(
    st.tuples(
        st.sampled_from(TYPES),
        names,
        st.sampled_from(NONCES),
        st.sampled_from(["", "1", "garbage"]),  # version_info
        errors,
    ),
    min_size=1,
    max_size=10,
)
delta_steps = st.lists(
    st.tuples(
        st.sampled_from(TYPES),
        names,  # subscribe
        names,  # unsubscribe
        st.sampled_from(NONCES),
        errors,
        st.dictionaries(st.sampled_from(NAMES), st.sampled_from(["", "1", "v"]), max_size=2),
    ),
    min_size=1,
    max_size=10,
)


def pick_nonce(choice: str, own: list[str], other: list[str]) -> str:
    if choice == "last":
        return own[-1] if own else ""
    if choice == "older":
        return own[-2] if len(own) > 1 else "0"
    if choice == "other-type":
        return other[-1] if other else "1"
    if choice == "made-up":
        return "x" * 300
    return ""


def run(stream: Stream, oracle: Any, requests: Iterator[Any], with_node: bool) -> None:
    """Send each request (built lazily: it may carry the nonce of the last answer), take the
    answer the oracle says it must get, then check how the stream ended."""
    seen: list[str] = []
    bad_input = not with_node
    for req in requests:
        if not req.type_url:
            bad_input = True
        if bad_input:
            stream.send(req)
            break
        must = oracle.must_answer(req)
        stream.send(req)
        for resp in stream.pending():
            assert resp is not None, f"stream ended early: {stream.code}"
            raise AssertionError(f"unexpected response of {resp.type_url} (rule 4)")
        if must:
            try:
                resp = stream.next(ANSWER_TIMEOUT)
            except queue.Empty:
                raise AssertionError(f"no answer to {req}") from None
            assert resp is not None, f"stream ended: {stream.code}"
            assert resp.type_url == req.type_url, (resp.type_url, req.type_url)
            oracle.on_response(resp)
            seen.append(resp.nonce)
    if bad_input:
        while (resp := stream.next(ANSWER_TIMEOUT)) is not None:
            seen.append(resp.nonce)
        assert stream.code is grpc.StatusCode.INVALID_ARGUMENT, stream.code
    else:
        # Half-close: whatever comes now was not asked for.
        rest = stream.finish()
        assert not rest, f"unexpected responses {[r.type_url for r in rest]} (rule 4)"
        assert stream.code is grpc.StatusCode.OK, stream.code
    assert len(seen) == len(set(seen)), f"nonces repeat on one stream: {seen}"
    event(f"{len(seen)} responses" if len(seen) < 3 else "3+ responses")


def other_nonces(oracle: Any, type_url: str) -> list[str]:
    return [n for t, s in oracle.types.items() if t != type_url for n in s.nonces]


@fuzz_settings(60)
@example(  # NACK the first CDS answer, then NACK again: nothing more may come
    steps=[
        (typeurls.CLUSTER, [], "none", "", ""),
        (typeurls.CLUSTER, [], "last", "", "bad config"),
        (typeurls.CLUSTER, [], "last", "", "bad config"),
    ],
    with_node=True,
)
@given(steps=sotw_steps, with_node=st.sampled_from([True, True, True, False]))
def test_sotw_request_sequences(
    live: ControlPlaneThread, node: str, steps: list[tuple[Any, ...]], with_node: bool
) -> None:
    oracle = SotwOracle()
    stream = Stream(live.target, delta=False)
    try:

        def build() -> Iterator[DiscoveryRequest]:
            for i, (type_url, names_, nonce, version, error) in enumerate(steps):
                own = oracle.types[type_url].nonces if type_url in oracle.types else []
                req = DiscoveryRequest(
                    type_url=type_url,
                    resource_names=names_,
                    version_info=version,
                    response_nonce=pick_nonce(nonce, own, other_nonces(oracle, type_url)),
                )
                if error:
                    req.error_detail.code = 3
                    req.error_detail.message = error
                if i == 0 and with_node:
                    req.node.id = node
                yield req

        run(stream, oracle, build(), with_node)
    finally:
        stream.close()


@fuzz_settings(60)
@example(  # NACK a delta answer: the same versions are never sent again
    steps=[
        (typeurls.CLUSTER, ["*"], [], "none", "", {}),
        (typeurls.CLUSTER, [], [], "last", "bad config", {}),
        (typeurls.CLUSTER, [ALPHA], [], "none", "", {}),
        (typeurls.CLUSTER, ["*"], [], "none", "", {}),
    ],
    with_node=True,
)
@example(  # reconnect with what the client holds: only what differs comes
    steps=[
        (typeurls.ENDPOINT, [ALPHA, BETA], [], "none", "", {ALPHA: "1", "nope": "v"}),
        (typeurls.ENDPOINT, [], [ALPHA], "last", "bad", {}),
        (typeurls.ENDPOINT, [ALPHA], [], "none", "", {}),
    ],
    with_node=True,
)
@example(  # NACK, after leaving the wildcard, of a response from before: no longer binding
    steps=[
        (typeurls.CLUSTER, [], [], "none", "", {}),
        (typeurls.CLUSTER, [ALPHA], ["*"], "none", "", {}),
        (typeurls.CLUSTER, ["*"], [], "older", "bad config", {}),
    ],
    with_node=True,
)
@given(steps=delta_steps, with_node=st.sampled_from([True, True, True, False]))
def test_delta_request_sequences(
    live: ControlPlaneThread, node: str, steps: list[tuple[Any, ...]], with_node: bool
) -> None:
    oracle = DeltaOracle()
    stream = Stream(live.target, delta=True)
    try:

        def build() -> Iterator[DeltaDiscoveryRequest]:
            for i, (type_url, sub, unsub, nonce, error, versions) in enumerate(steps):
                own = oracle.types[type_url].nonces if type_url in oracle.types else []
                req = DeltaDiscoveryRequest(
                    type_url=type_url,
                    resource_names_subscribe=sub,
                    resource_names_unsubscribe=unsub,
                    initial_resource_versions=versions,
                    response_nonce=pick_nonce(nonce, own, other_nonces(oracle, type_url)),
                )
                if error:
                    req.error_detail.code = 3
                    req.error_detail.message = error
                if i == 0 and with_node:
                    req.node.id = node
                yield req

        run(stream, oracle, build(), with_node)
    finally:
        stream.close()
