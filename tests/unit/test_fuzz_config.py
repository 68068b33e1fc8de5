"""Fuzzing the config loader (hypothesis): valid manifests of every supported kind, mutated
(keys deleted or renamed, values replaced by other types, huge or negative numbers, unicode,
deep nesting, values swapped between fields, documents duplicated, the text cut, broken or
spliced with YAML syntax) and hostile YAML (alias bombs, merge-key bombs, custom tags).

Properties: loading raises only ConfigError, whose message is one line `file:line: reason`
with a line inside the file; a file that loads merges and generates Envoy config for proxies
without any exception (a validator that lets through what a generator cannot handle would be
a traceback on every push); and the good manifests load without warnings."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest
import yaml
from hypothesis import event, example, given
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from control.config.errors import ConfigError
from control.config.loader import load_bytes
from control.config.merge import merge
from control.config.yamlsource import last_line
from control.generate import generators_for
from control.generate.context import GenContext
from control.generate.resource_names import CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE
from control.model.index import MeshIndex
from control.model.proxy import proxy_from_node
from control.model.types import MeshConfig
from control.xds.cache import ResourceCache
from tests.support.configfuzz import CORPUS, dump, mutated_docs, mutated_text
from tests.support.fuzz import fuzz_settings

# Proxies to generate for: in the namespaces the corpus uses, with labels it selects.
PROXIES = [
    proxy_from_node(f"sidecar~10.1.0.{i}~p{i}.{ns}~{ns}.svc.cluster.local", {"LABELS": labels})
    for i, (ns, labels) in enumerate(
        [
            ("default", {"app": "reviews", "version": "v1"}),
            ("bookinfo", {"app": "ratings"}),
            ("shop", {"app": "web"}),
        ],
        start=1,
    )
] + [
    # A router: the corpus's Gateways select it (tests/support/gateways.py).
    proxy_from_node(
        "router~10.1.0.9~ingress.edge~edge.svc.cluster.local",
        {"LABELS": {"istio": "ingressgateway"}, "SDS": "true"},
    ),
    # The router of the Gateway API corpus's Gateway (tests/support/gatewayapi.py).
    proxy_from_node(
        "router~10.1.0.10~gw.infra~infra.svc.cluster.local",
        {"LABELS": {"gateway.networking.k8s.io/gateway-name": "gw"}, "SDS": "true"},
    ),
]
TYPES = (CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE)


def generate_all(mesh: MeshConfig) -> None:
    ctx = GenContext(MeshIndex(mesh, ()), ResourceCache())
    for proxy in PROXIES:
        for t in TYPES:
            generators_for(proxy)[t](ctx, proxy)


def note(outcome: str) -> None:
    """Tally outcomes for --hypothesis-show-statistics (check() also runs outside hypothesis)."""
    if currently_in_test_context():
        event(outcome)


def check(data: bytes | str, file: str = "fuzz.yaml") -> MeshConfig | ConfigError:
    """The properties: only ConfigError, one line, pointing into the file; what loads also
    merges and generates."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    try:
        fc = load_bytes(raw, file)
        mesh = merge([fc])
    except ConfigError as e:
        message = str(e)
        assert message.startswith(f"{file}:{e.line}: "), message
        assert "\n" not in message and "\r" not in message, repr(message)
        text = raw.decode("utf-8", "replace")
        assert 1 <= e.line <= last_line(text), (e.line, message)
        assert e.reason.strip(), message
        note("refused")
        return e
    generate_all(mesh)
    note("loaded with warnings" if mesh.warnings else "loaded")
    return mesh


def test_the_corpus_loads_and_generates_without_warnings() -> None:
    for name, text in CORPUS.items():
        mesh = check(text, f"{name}.yaml")
        assert isinstance(mesh, MeshConfig), mesh
        assert [str(w) for w in mesh.warnings if name != "sample-app"] == [], name


@fuzz_settings(300)
@given(docs=mutated_docs())
def test_mutated_manifests_give_clear_errors_or_load(docs: list[Any]) -> None:
    try:
        text = dump(docs)
    except (yaml.YAMLError, RecursionError):
        return  # PyYAML cannot write this tree; nothing to feed the loader
    check(text)


@fuzz_settings(300)
# Regression: a syntax error at the end of a file without a final newline was reported one
# line past the end of the file.
@example(text="apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {")
# Regression: YAML folds NEL (U+0085) inside a flow scalar into a line break, and the name
# holding it was quoted into the error as a second line.
@example(
    text="apiVersion: networking.istio.io/v1\nkind: DestinationRule\n"
    "metadata: {name: r\x85\x85eviews, namespace: default}\nspec: {host: reviews}\n"
)
@given(text=mutated_text())
def test_broken_yaml_text_gives_clear_errors(text: str) -> None:
    check(text)


@fuzz_settings(100)
@example(data=b"\xff\xfe\x00")
@example(data=b"kind: Service\n\xc3\x28\n")
@example(data=b'\r"')
@given(data=st.binary(max_size=300))
def test_random_bytes_give_clear_errors(data: bytes) -> None:
    check(data)


# --- hostile YAML ---------------------------------------------------------------------------------


def laughs(levels: int, fanout: int = 10) -> str:
    """Billion laughs: each level lists the one below `fanout` times."""
    lines = ['l0: &l0 "lol"']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fanout)}]")
    return "\n".join(lines) + f"\nspec: *l{levels - 1}\n"


def merge_bomb(keys: int, merges: int) -> str:
    base = "base: &b\n" + "".join(f"  k{i}: {i}\n" for i in range(keys))
    return base + "".join(f"m{j}:\n  <<: *b\n" for j in range(merges))


@pytest.mark.parametrize(
    "text",
    [
        laughs(9),  # 10^8 strings once expanded
        laughs(30, 2),  # 2^29, deep
        "a: &a [*a]\n",  # an alias to itself
        "a: &a {b: *a}\n",
        merge_bomb(100, 2_000),  # a mapping merged very many times
    ],
    ids=["billion-laughs", "deep-doubling", "self-list", "self-map", "many-merges"],
)
def test_alias_bombs_are_refused_in_bounded_memory(text: str) -> None:
    tracemalloc.start()
    try:
        err = check(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(err, ConfigError)
    assert "alias" in err.reason, err.reason
    assert peak < 64 << 20, peak  # the expanded documents would need gigabytes


@pytest.mark.timeout(60)
def test_a_large_merged_mapping_loads_in_linear_time() -> None:
    """Regression: merged keys' line numbers were copied with a pass over every source line
    per key, so this (1 MB, 60,000 keys) took minutes; now well under a second. The timeout
    is a bound, not a measurement."""
    err = check(merge_bomb(60_000, 1))
    assert isinstance(err, ConfigError) and err.reason == "apiVersion: is required"


@pytest.mark.parametrize(
    "text",
    [
        "!!python/object/apply:os.system ['true']\n",
        "apiVersion: v1\nkind: Service\nmetadata: !custom {name: x}\n",
        "apiVersion: v1\nkind: !!binary aGk=\n",
        "apiVersion: v1\nkind: Service\nmetadata: {name: a, name: b}\n",
        "apiVersion: v1\nkind: Service\n? [a, b]\n: c\n",
        "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{port: .nan}]}\n",
        "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{port: 1e400}]}\n",
        "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{port: 0b11}]}\n",
        "- 1\n- 2\n",
        "just text\n",
        "---\n---\n...\n",
        "\ufeffapiVersion: v1\n",
        "apiVersion: v1\r\nkind: Service\r\nmetadata: {name: x\r\n",
        "a:\n\tb: 1\n",
        "[" * 5000 + "\n",
        "{a: " * 5000 + "\n",
    ],
)
def test_hostile_yaml_gives_clear_errors(text: str) -> None:
    check(text)


def test_non_finite_numbers_are_refused_as_ports() -> None:
    for bad in (".inf", "-.inf", ".nan", "1e400"):
        err = check(
            "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: default}\n"
            f"spec: {{ports: [{{port: {bad}}}]}}\n"
        )
        assert isinstance(err, ConfigError), bad
        assert "spec.ports" in err.reason, err.reason
