"""Revisions without sockets: which injector a pod belongs to (Istio's revisioned webhook
selectors: namespace istio.io/rev, else the pod's, istio-injection meaning the default), what
a revision's injection adds (its label, status, its own control plane address), the
--revision flag, kube-inject --revision, and config labelled for a revision."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from control.config.loader import load_text
from control.ctl.kubeinject import inject_documents
from control.security import SecurityOptions
from control.webhook.cabundle import default_name
from control.webhook.decision import STATUS_ANNOTATION, decide
from control.webhook.flags import add_injection_flags
from control.webhook.inject import injection_patch
from control.webhook.jsonpatch import apply_patch
from control.webhook.template import load_template
from control.webhook.values import InjectionValues

TEMPLATE = load_template()
INJECT = "sidecar.istio.io/inject"
REV = "istio.io/rev"


def pod(**labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web-1", "namespace": "shop", "labels": {"app": "web", **labels}},
        "spec": {"containers": [{"name": "web", "image": "web:1"}]},
    }


@pytest.mark.parametrize(
    ("ns_labels", "labels", "default", "canary"),
    [
        ({"istio-injection": "enabled"}, {}, True, False),
        ({REV: "canary"}, {}, False, True),
        ({REV: "canary"}, {INJECT: "false"}, False, False),  # opt-out wins everywhere
        ({}, {REV: "canary"}, False, True),
        ({}, {REV: "canary", INJECT: "true"}, False, True),
        ({}, {INJECT: "true"}, True, False),
        ({}, {}, False, False),
        # istio-injection sends the namespace to the default revision, whatever the pod says
        ({"istio-injection": "enabled"}, {REV: "canary"}, True, False),
        ({"istio-injection": "disabled"}, {REV: "canary"}, False, False),
        # the namespace's revision wins over the pod's
        ({REV: "stable"}, {REV: "canary"}, False, False),
        ({REV: "canary"}, {REV: "stable"}, False, True),
        # "default" names the default revision
        ({REV: "default"}, {}, True, False),
        ({}, {REV: "default"}, True, False),
    ],
)
def test_which_revision_injects(
    ns_labels: dict[str, str], labels: dict[str, str], default: bool, canary: bool
) -> None:
    p = pod(**labels)
    assert decide(p, ns_labels).inject is default
    assert decide(p, ns_labels, "default").inject is default
    assert decide(p, ns_labels, "canary").inject is canary


def test_a_revisions_injection() -> None:
    p = pod(**{REV: "canary"})
    decision, patch = injection_patch(p, {}, TEMPLATE, InjectionValues(revision="canary"))
    assert decision.inject, decision.reason
    out = apply_patch(p, patch)
    proxy = out["spec"]["containers"][1]
    env = {e["name"]: e.get("value") for e in proxy["env"]}
    assert env["PILOT_ADDRESS"] == "istiod-canary.istio-system.svc:15012"
    assert f"{REV}=canary" in env["ISTIO_META_LABELS"].split(",")
    assert out["metadata"]["labels"][REV] == "canary"
    assert json.loads(out["metadata"]["annotations"][STATUS_ANNOTATION])["revision"] == "canary"
    # A given address wins; the default revision adds no label of its own.
    values = InjectionValues(pilot_address="cp.mesh:15012", revision="canary")
    out = apply_patch(p, injection_patch(p, {}, TEMPLATE, values)[1])
    env = {e["name"]: e.get("value") for e in out["spec"]["containers"][1]["env"]}
    assert env["PILOT_ADDRESS"] == "cp.mesh:15012"
    plain = pod(**{INJECT: "true"})
    out = apply_patch(plain, injection_patch(plain, {}, TEMPLATE)[1])
    assert REV not in out["metadata"]["labels"]
    assert json.loads(out["metadata"]["annotations"][STATUS_ANNOTATION])["revision"] == "default"


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(exit_on_error=False)
    add_injection_flags(p)
    return p.parse_args(argv)


def test_revision_flag() -> None:
    assert parse().revision == ""
    assert parse("--revision", "canary").revision == "canary"
    assert parse("--revision", "default").revision == ""
    with pytest.raises(argparse.ArgumentError, match="is not a revision"):
        parse("--revision", "Canary_1")
    # A revision's serving certificates also name its own Service.
    assert SecurityOptions(revision="canary").service_names == [
        "istiod.istio-system.svc",
        "istiod-canary.istio-system.svc",
    ]
    assert SecurityOptions().service_names == ["istiod.istio-system.svc"]
    assert default_name("") == "pilotfish-sidecar-injector"
    assert default_name("canary") == "pilotfish-sidecar-injector-canary"


def test_kube_inject_with_a_revision() -> None:
    text = "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: a}]}\n"
    out = inject_documents(text, TEMPLATE, InjectionValues(revision="canary"))
    assert "istiod-canary.istio-system.svc:15012" in out and "istio.io/rev: canary" in out


CONFIG = """\
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: for-canary, labels: {istio.io/rev: canary}}
spec: {hosts: [a.example.com], ports: [{number: 80, name: http, protocol: HTTP}], resolution: DNS}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: for-stable, labels: {istio.io/rev: stable}}
spec: {hosts: [b.example.com], ports: [{number: 80, name: http, protocol: HTTP}], resolution: DNS}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: for-all}
spec: {hosts: [c.example.com], ports: [{number: 80, name: http, protocol: HTTP}], resolution: DNS}
---
apiVersion: v1
kind: Service
metadata: {name: web, labels: {istio.io/rev: stable}}
spec: {selector: {app: web}, ports: [{port: 80, name: http}]}
"""


def names(revision: str) -> set[str]:
    return {o.source.name for o in load_text(CONFIG, "mesh.yaml", revision=revision).objects}


def test_config_labelled_for_a_revision() -> None:
    """As Istio's LabelsInRevision: Istio config labelled for another revision is left out;
    unlabelled config and Kubernetes kinds are for every revision; no revision is the
    revision "default"."""
    assert names("canary") == {"for-canary", "for-all", "web"}
    assert names("stable") == {"for-stable", "for-all", "web"}
    assert names("") == {"for-all", "web"}
