"""Config fuzzing material shared by the unit fuzz (the loader) and the live fuzz (a control
plane watching a directory): a corpus of valid manifests of every supported kind and
hypothesis strategies that mutate them (as trees and as text)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from tests.support.gatewayapi import GATEWAY_API_YAML
from tests.support.gateways import GATEWAY_MESH
from tests.support.traffic import TRAFFIC_YAML
from tests.unit.test_config_secret import GW_SECRET
from tests.unit.test_config_service import REVIEWS
from tests.unit.test_config_serviceentry import EXTERNAL_API
from tests.unit.test_config_sidecar import RATINGS
from tests.unit.test_config_workloadentry import VM
from tests.unit.test_config_workloadgroup import GROUP

ROOT = Path(__file__).resolve().parents[2]

SECURITY = """\
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: web, namespace: shop}
spec:
  selector:
    matchLabels: {app: web}
  mtls: {mode: PERMISSIVE}
  portLevelMtls:
    8080: {mode: DISABLE}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: web, namespace: shop}
spec:
  selector:
    matchLabels: {app: web}
  action: ALLOW
  rules:
  - from:
    - source:
        principals: ["cluster.local/ns/shop/sa/client", "*/sa/admin"]
        notNamespaces: [test]
    - source: {namespaces: ["ops-*"]}
    to:
    - operation:
        paths: ["/api/*", "/healthz"]
        methods: [GET, HEAD]
        ports: ["8080", 9090]
        notPaths: ["*.php"]
  - {}
"""

# Every supported kind, with most of its fields (the fixtures of the kinds' own unit tests,
# the local demo mesh and the Kubernetes sample app).
CORPUS: dict[str, str] = {
    "traffic": TRAFFIC_YAML.lstrip("\n"),
    "service": REVIEWS.lstrip("\n"),
    "serviceentry": EXTERNAL_API.lstrip("\n"),
    "sidecar": RATINGS.lstrip("\n"),
    "workloadentry": VM.lstrip("\n"),
    "workloadgroup": GROUP.lstrip("\n"),
    "security": SECURITY,
    "gateway": GATEWAY_MESH.lstrip("\n"),
    "secret": GW_SECRET.removeprefix("---\n"),
    "gatewayapi": GATEWAY_API_YAML,
    "demo": (ROOT / "examples/local/mesh.yaml").read_text(),
    "sample-app": (ROOT / "examples/kubernetes/sample-app.yaml").read_text(),
}
PARSED = {
    name: [d for d in yaml.safe_load_all(text) if d is not None] for name, text in CORPUS.items()
}

# --- mutations of the parsed documents ----------------------------------------------------------

Path_ = tuple[Any, ...]

odd_strings = st.sampled_from(
    [
        "",
        " ",
        "*",
        "~",
        "null",
        "0.0.0.0:99999",
        "unix://",
        "1.2.3.4/33",
        "::1",
        "fe80::1%eth0",
        "300.1.1.1",
        "a" * 300,
        "é",
        "\u202e",
        "\U0001f600",
        "ns/*",
        "./*",
        "*/*",
        "1s",
        "-1s",
        "1e9h",
        "0.0001ms",
        "100%",
        "ISTIO_MUTUAL",
        "STRICT",
        "HTTP",
        "TCP",
        "outbound|9080||x",
        "-",
        "--",
        "[",
        "{",
        "\\",
        "0x10",
        "010",
        "1_000",
        "+1",
    ]
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 65535, 65536, 2**31, 2**63, -(2**63), 10**30]),
    st.floats(),
    st.text(max_size=20),
    odd_strings,
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.text(max_size=8), odd_strings), inner, max_size=3),
    ),
    max_leaves=8,
)


def paths_of(value: Any, path: Path_ = ()) -> Iterator[Path_]:
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths_of(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths_of(v, (*path, i))


def get(root: Any, path: Path_) -> Any:
    for p in path:
        root = root[p]
    return root


def nested(depth: int) -> Any:
    value: Any = "deep"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


@st.composite
def mutated_docs(draw: st.DrawFn) -> list[Any]:
    docs = copy.deepcopy(PARSED[draw(st.sampled_from(sorted(PARSED)))])
    for _ in range(draw(st.integers(1, 4))):
        paths = list(paths_of(docs))[1:]  # not the list of documents itself
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent, key = get(docs, path[:-1]), path[-1]
        op = draw(
            st.sampled_from(["delete", "replace", "replace", "swap", "rename", "dup", "nest"])
        )
        if op == "delete":
            del parent[key]
        elif op == "replace":
            parent[key] = draw(values)
        elif op == "swap":
            other = draw(st.sampled_from(paths))
            try:
                other_parent, other_key = get(docs, other[:-1]), other[-1]
                parent[key], other_parent[other_key] = other_parent[other_key], parent[key]
            except (KeyError, IndexError, TypeError):
                pass  # the other path went away with an earlier swap
        elif op == "rename" and isinstance(parent, dict):
            parent[draw(st.one_of(odd_strings, st.text(max_size=10)))] = parent.pop(key)
        elif op == "dup":
            # Duplicate a list item, or a whole document (same kind, namespace and name).
            target = parent if isinstance(parent, list) and parent else docs
            target.append(copy.deepcopy(draw(st.sampled_from(target))))
        elif op == "nest":
            parent[key] = nested(draw(st.sampled_from([5, 60, 99, 101, 150])))
    return docs


def dump(docs: list[Any]) -> str:
    return yaml.safe_dump_all(docs, allow_unicode=True, sort_keys=False)


# --- mutations of the text ----------------------------------------------------------------------

SYNTAX = [":", "- ", "[", "]", "{", "}", ",", "&a ", "*a", "*nope", "!", "!!python/object ",
          "|", ">", "'", '"', "#", "%", "@", "`", "\t", "\n", "\n---\n", "\n...\n", "<<: ",
          "? ", "  ", "\x00", "\ufeff", "\x85", "\r", "\\"]  # fmt: skip


@st.composite
def mutated_text(draw: st.DrawFn) -> str:
    text = draw(st.one_of(st.sampled_from(list(CORPUS.values())), mutated_docs().map(dump)))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["truncate", "insert", "delete", "indent", "lines"]))
        n = len(text)
        at = draw(st.integers(0, n))
        if op == "truncate":
            text = text[:at]
        elif op == "insert":
            piece = draw(st.one_of(st.sampled_from(SYNTAX), st.text(max_size=5)))
            text = text[:at] + piece + text[at:]
        elif op == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 40)) :]
        else:
            lines = text.split("\n")
            i = draw(st.integers(0, len(lines) - 1))
            if op == "indent":
                lines[i] = draw(st.sampled_from(["", " ", "   ", "\t"])) + lines[i].lstrip()
            else:
                j = draw(st.integers(0, len(lines) - 1))
                lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
    return text
