"""The root certificate publisher's decisions (control/kube/rootcert.py), without sockets:
what to write for a namespace, what to do after a refusal, which namespaces are due."""

from __future__ import annotations

from typing import Any

import pytest

from control.kube.rootcert import (
    CONFIG_LABEL,
    CONFIGMAP_NAME,
    DATA_KEY,
    DEFAULT_EXCLUDED,
    Recovery,
    Verb,
    Write,
    new_configmap,
    pending,
    plan,
    publishes_to,
    recovery,
)

ROOT = "-----BEGIN CERTIFICATE-----\nour root\n-----END CERTIFICATE-----\n"


def namespace(name: str, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, **extra}


def stored(ns: str, pem: str = ROOT, rv: str = "7", **meta: Any) -> dict[str, Any]:
    cm = new_configmap(ns, pem)
    cm["metadata"].update(resourceVersion=rv, **meta)
    return cm


def test_absent_is_created_labelled_as_istio_does() -> None:
    write = plan("shop", None, ROOT)
    assert write is not None and write.verb is Verb.CREATE
    assert write.path == "/api/v1/namespaces/shop/configmaps"
    assert write.body["metadata"] == {
        "name": CONFIGMAP_NAME,
        "namespace": "shop",
        "labels": {CONFIG_LABEL: "true"},
    }
    assert write.body["data"] == {DATA_KEY: ROOT}


def test_ours_needs_nothing() -> None:
    assert plan("shop", stored("shop"), ROOT) is None


def test_tampered_is_updated_conditionally_keeping_the_rest() -> None:
    current = stored("shop", "someone else's", rv="12", annotations={"a": "b"})
    current["data"]["extra.pem"] = "kept"
    current["metadata"]["labels"] = {"team": "x"}
    write = plan("shop", current, ROOT)
    assert write is not None and write.verb is Verb.UPDATE
    assert write.path == f"/api/v1/namespaces/shop/configmaps/{CONFIGMAP_NAME}"
    assert write.body["metadata"]["resourceVersion"] == "12"  # conditional PUT
    assert write.body["metadata"]["annotations"] == {"a": "b"}
    assert write.body["metadata"]["labels"] == {"team": "x", CONFIG_LABEL: "true"}
    assert write.body["data"] == {DATA_KEY: ROOT, "extra.pem": "kept"}
    assert current["data"][DATA_KEY] == "someone else's"  # the cached copy is not touched


def test_a_missing_label_alone_is_drift() -> None:
    current = stored("shop")
    del current["metadata"]["labels"]
    write = plan("shop", current, ROOT)
    assert write is not None and write.body["metadata"]["labels"] == {CONFIG_LABEL: "true"}


def test_data_removed_is_drift() -> None:
    current = stored("shop")
    current["data"] = None
    write = plan("shop", current, ROOT)
    assert write is not None and write.body["data"] == {DATA_KEY: ROOT}


@pytest.mark.parametrize(
    ("verb", "status", "want"),
    [
        (Verb.UPDATE, 409, Recovery.REREAD),  # stale resourceVersion: another writer won
        (Verb.CREATE, 409, Recovery.REREAD),  # AlreadyExists: another replica created it
        (Verb.UPDATE, 404, Recovery.CREATE),  # deleted between our read and our write
        (Verb.CREATE, 404, Recovery.GIVE_UP),  # the namespace is gone
        (Verb.CREATE, 403, Recovery.GIVE_UP),  # terminating namespace, or no RBAC
        (Verb.UPDATE, 422, Recovery.GIVE_UP),
        (Verb.UPDATE, 500, Recovery.GIVE_UP),
    ],
)
def test_recovery(verb: Verb, status: int, want: Recovery) -> None:
    assert recovery(Write(verb, "shop", {}), status) is want


def test_istio_system_namespaces_are_excluded_by_default() -> None:
    assert DEFAULT_EXCLUDED == {
        "kube-system",
        "kube-public",
        "kube-node-lease",
        "local-path-storage",
    }
    for name in DEFAULT_EXCLUDED:
        assert not publishes_to(namespace(name), DEFAULT_EXCLUDED)
    assert publishes_to(namespace("istio-system"), DEFAULT_EXCLUDED)
    assert publishes_to(namespace("default"), DEFAULT_EXCLUDED)
    assert publishes_to(namespace("kube-system"), frozenset())


def test_terminating_namespaces_are_left_alone() -> None:
    assert not publishes_to(namespace("old", status={"phase": "Terminating"}), frozenset())
    gone = {"metadata": {"name": "old", "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert not publishes_to(gone, frozenset())
    assert publishes_to(namespace("new", status={"phase": "Active"}), frozenset())


def test_pending_lists_only_namespaces_that_differ() -> None:
    namespaces = [namespace(n) for n in ("b", "a", "c", "d", "kube-system")]
    configmaps = {
        ("a", CONFIGMAP_NAME): stored("a"),
        ("b", CONFIGMAP_NAME): stored("b", "tampered"),
        # c: none; d: one in another namespace does not count
        ("x", CONFIGMAP_NAME): stored("x"),
    }
    assert pending(namespaces, configmaps, ROOT, DEFAULT_EXCLUDED) == ["b", "c", "d"]
    # Once written, nothing is due: no write loop.
    for ns in ("b", "c", "d"):
        configmaps[(ns, CONFIGMAP_NAME)] = stored(ns)
    assert pending(namespaces, configmaps, ROOT, DEFAULT_EXCLUDED) == []


def test_null_labels_and_data_are_drift_not_a_crash() -> None:
    current = stored("shop")
    current["metadata"]["labels"] = None
    current["data"] = None
    write = plan("shop", current, ROOT)
    assert write is not None and write.verb is Verb.UPDATE
    assert write.body["metadata"]["labels"] == {CONFIG_LABEL: "true"}
    assert write.body["data"] == {DATA_KEY: ROOT}
    assert write.body["metadata"]["resourceVersion"] == "7"


def test_the_exclusion_flag() -> None:
    from control.__main__ import build_parser

    parse = build_parser().parse_args
    assert parse([]).root_cert_excluded_namespaces is None  # Istio's defaults
    args = parse(["--root-cert-excluded-namespaces", "kube-system, legacy,"])
    assert args.root_cert_excluded_namespaces == {"kube-system", "legacy"}
    assert parse(["--root-cert-excluded-namespaces", ""]).root_cert_excluded_namespaces == set()
