"""YAML parsing with line numbers, and the Kubernetes object envelope (control/config)."""

from __future__ import annotations

import textwrap

import pytest

from control.config.errors import ConfigError
from control.config.loader import load_bytes, load_text
from control.config.manifest import format_path, objects_of
from control.config.yamlsource import parse_yaml


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def error_of(text: str, file: str = "mesh.yaml") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_text(dedent(text), file)
    return info.value


def test_config_error_format() -> None:
    err = ConfigError("conf/a.yaml", 7, "bad thing")
    assert str(err) == "conf/a.yaml:7: bad thing"
    assert (err.file, err.line, err.reason) == ("conf/a.yaml", 7, "bad thing")


def test_lines_of_nodes_are_recorded() -> None:
    (doc,) = parse_yaml(
        dedent(
            """
            # leading comment
            apiVersion: v1
            kind: Service
            spec:
              ports:
              - name: http
                port: 80
              - name: grpc
                port: 90
            """
        ),
        "f.yaml",
    )
    assert doc.line == 2
    assert doc.lines["spec",] == 4
    assert doc.lines["spec", "ports", 1] == 8
    assert doc.lines["spec", "ports", 1, "port"] == 9
    # A missing field reports the line of its nearest ancestor.
    assert doc.line_of(("spec", "ports", 1, "targetPort")) == 8
    assert doc.line_of(("spec", "selector")) == 4


def test_empty_documents_are_skipped() -> None:
    text = "---\n# only a comment\n---\n\n---\napiVersion: v1\nkind: Service\n---\n...\n"
    docs = parse_yaml(text, "f.yaml")
    assert [d.line for d in docs] == [6]
    assert load_text("", "empty.yaml").objects == ()
    assert load_text("# nothing\n", "empty.yaml").objects == ()


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        (
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: a: b\n",
            4,
            "invalid YAML: mapping values are not allowed in this context",
        ),
        (
            "spec:\n  ports:\n    - port: 1\n   - port: 2\n",
            4,
            "invalid YAML: did not find expected key "
            "(while parsing a block mapping started at line 2)",
        ),
        (
            "a: 1\nb: 'unterminated\nc: 3\n",
            4,
            "invalid YAML: found unexpected end of stream "
            "(while scanning a quoted scalar started at line 2)",
        ),
        ("a: 1\nb: *nothing\n", 2, "invalid YAML: found undefined alias"),
        ("a: 1\nb:\n\tc: 2\n", 3, "invalid YAML: found character that cannot start any token"),
        ("a: 1\n\nb: x\x07y\n", 3, "invalid YAML: unacceptable character #x0007"),
    ],
)
def test_syntax_errors_report_the_yaml_line(text: str, line: int, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml(text, "conf/bad.yaml")
    assert info.value.file == "conf/bad.yaml"
    assert info.value.line == line
    assert info.value.reason.startswith(reason)


def test_syntax_error_in_a_later_document_has_its_line() -> None:
    text = "apiVersion: v1\nkind: Service\n---\napiVersion: v1\nkind: [oops\n"
    with pytest.raises(ConfigError) as info:
        parse_yaml(text, "f.yaml")
    assert info.value.line == 6


def test_duplicate_keys_are_errors() -> None:
    err = error_of(
        """
        apiVersion: v1
        kind: Service
        metadata:
          name: a
          name: b
        """
    )
    assert str(err) == "mesh.yaml:5: duplicate key 'name' (first defined at line 4)"


def test_non_string_keys_and_custom_tags_are_errors() -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml("a: 1\n? [x]\n: 2\n", "f.yaml")
    assert info.value.line == 2
    assert "mapping keys must be strings" in info.value.reason
    with pytest.raises(ConfigError) as info:
        parse_yaml("a: 1\nb: !Ref thing\n", "f.yaml")
    assert (info.value.line, info.value.reason) == (
        2,
        "unsupported YAML tag !Ref on value 'thing'",
    )


def test_scalars_follow_the_yaml_core_schema_and_timestamps_stay_strings() -> None:
    (doc,) = parse_yaml(
        "i: 8080\nf: 1.5\nb: true\nn: ~\ns: '8080'\nt: 2024-01-02T03:04:05Z\nh: 0x10\n", "f"
    )
    assert doc.value == {
        "i": 8080,
        "f": 1.5,
        "b": True,
        "n": None,
        "s": "8080",
        "t": "2024-01-02T03:04:05Z",
        "h": 16,
    }


def test_anchors_aliases_and_merge_keys() -> None:
    text = dedent(
        """
        base: &base
          app: reviews
          version: v1
        labels:
          <<: *base
          version: v2
        """
    )
    (doc,) = parse_yaml(text, "f.yaml")
    assert doc.value["labels"] == {"app": "reviews", "version": "v2"}
    assert doc.lines["labels", "version"] == 6  # the key stated here wins, with its line
    assert doc.lines["labels", "app"] == 2  # merged keys point at the anchor


def test_recursive_alias_is_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml("a: &x\n  - *x\n", "f.yaml")
    assert "recursive YAML alias" in info.value.reason


def test_alias_bomb_is_an_error_not_a_hang() -> None:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 9):
        refs = ", ".join([f"*a{i - 1}"] * 10)
        lines.append(f"a{i}: &a{i} [{refs}]")
    with pytest.raises(ConfigError) as info:
        parse_yaml("\n".join(lines) + "\n", "bomb.yaml")
    assert "document too large" in info.value.reason


def test_deep_nesting_is_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml("a: " + "[" * 150 + "]" * 150 + "\n", "deep.yaml")
    assert "nested too deeply" in info.value.reason


def test_invalid_utf8_is_an_error_with_its_line() -> None:
    with pytest.raises(ConfigError) as info:
        load_bytes(b"apiVersion: v1\nkind: Service\nmetadata:\n  name: caf\xe9\n", "x.yaml")
    assert str(info.value) == "x.yaml:4: file is not valid UTF-8 (byte 0xe9)"


def test_utf8_bom_is_accepted() -> None:
    data = "\ufeffapiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n".encode()
    assert load_bytes(data, "bom.yaml").warnings[0].source.kind == "ConfigMap"


def test_json_files_parse_as_yaml() -> None:
    text = (
        '{\n\t"apiVersion": "v1",\n\t"kind": "Service",\n\t"metadata": {"name": "web"},\n'
        '\t"spec": {"ports": [{"name": "http", "port": 80}]}\n}\n'
    )
    fc = load_text(text, "svc.json")
    assert fc.objects[0].services[0].hostname == "web.default.svc.cluster.local"


# --- the envelope ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("kind: Service\nmetadata: {name: a}\n", "mesh.yaml:1: apiVersion: is required"),
        ("apiVersion: v1\nmetadata: {name: a}\n", "mesh.yaml:1: kind: is required"),
        ("apiVersion: v1\nkind: 3\n", "mesh.yaml:2: kind: must be a string"),
        (
            "apiVersion: v1\nkind: Service\n",
            "mesh.yaml:1: metadata: is required (with at least a name)",
        ),
        (
            "apiVersion: v1\nkind: Service\nmetadata: []\n",
            "mesh.yaml:3: metadata: must be a mapping",
        ),
        (
            "apiVersion: v1\nkind: Service\nmetadata:\n  namespace: prod\n",
            "mesh.yaml:3: metadata.name: is required",
        ),
        (
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: 12\n",
            "mesh.yaml:4: metadata.name: must be a string",
        ),
        (
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: a\n  namespace: Prod_1\n",
            "mesh.yaml:5: metadata.namespace: must be a DNS label: at most 63 lowercase letters, "
            "digits and '-', starting and ending with a letter or digit",
        ),
        (
            "- apiVersion: v1\n  kind: Service\n",
            "mesh.yaml:1: expected a Kubernetes object (a mapping with apiVersion, kind, "
            "metadata), got a list",
        ),
        (
            "just a string\n",
            "mesh.yaml:1: expected a Kubernetes object (a mapping with apiVersion, kind, "
            "metadata), got the value 'just a string'",
        ),
    ],
)
def test_envelope_errors(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(text, "mesh.yaml")
    assert str(info.value) == expected


def test_namespace_defaults_to_default() -> None:
    fc = load_text(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{port: 80}]}\n", "f"
    )
    assert fc.objects[0].source.namespace == "default"
    assert fc.objects[0].services[0].hostname == "web.default.svc.cluster.local"


def test_list_kind_is_expanded_with_item_lines() -> None:
    text = dedent(
        """
        apiVersion: v1
        kind: List
        items:
        - apiVersion: v1
          kind: Service
          metadata: {name: one, namespace: shop}
          spec:
            ports: [{name: http, port: 80}]
        - apiVersion: v1
          kind: Service
          metadata: {name: two, namespace: shop}
          spec:
            ports: [{name: http, port: 80}]
        """
    )
    fc = load_text(text, "list.yaml")
    assert [(o.source.name, o.source.line) for o in fc.objects] == [("one", 4), ("two", 9)]
    (doc,) = parse_yaml(text, "list.yaml")
    assert [o.name for o in objects_of(doc)] == ["one", "two"]


def test_error_inside_a_list_item_points_at_the_item_field() -> None:
    err = error_of(
        """
        apiVersion: v1
        kind: List
        items:
        - apiVersion: v1
          kind: Service
          metadata: {name: ok}
          spec: {ports: [{port: 80}]}
        - apiVersion: v1
          kind: Service
          metadata:
            namespace: shop
        """
    )
    assert str(err) == "mesh.yaml:10: items[1].metadata.name: is required"


def test_empty_list_kind_loads_nothing() -> None:
    assert load_text("apiVersion: v1\nkind: List\nitems: []\n", "f").objects == ()


def test_format_path() -> None:
    assert format_path(("spec", "ports", 0, "port")) == "spec.ports[0].port"
    assert format_path(("spec", "selector", "app.kubernetes.io/name")) == (
        "spec.selector['app.kubernetes.io/name']"
    )
    assert format_path(()) == ""
