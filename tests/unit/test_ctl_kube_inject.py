"""`pilotfish-ctl kube-inject`: the real CLI (a subprocess, stdin and files), the same patch
as the webhook, output that is valid Kubernetes YAML, clear errors for bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from control.ctl.kubeinject import inject_documents
from control.webhook.inject import injection_patch
from control.webhook.jsonpatch import apply_patch
from control.webhook.template import load_template
from control.webhook.values import InjectionValues

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: shop
spec:
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
      annotations:
        sidecar.istio.io/interceptionMode: REDIRECT
    spec:
      containers:
        - name: web
          image: web:1
---
apiVersion: v1
kind: Pod
metadata:
  name: batch
  labels: {sidecar.istio.io/inject: "false"}
spec:
  containers: [{name: batch, image: batch:1}]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
"""


def kube_inject(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "control.ctl", "kube-inject", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_kube_inject_from_stdin_matches_the_webhook_patch() -> None:
    r = kube_inject("-f", "-", "--pilot-address", "istiod.mesh:15012", stdin=DEPLOYMENT)
    assert r.returncode == 0, r.stderr
    deployment, pod, service = yaml.safe_load_all(r.stdout)
    template = deployment["spec"]["template"]
    names = [c["name"] for c in template["spec"]["containers"]]
    assert names == ["web", "istio-proxy"]
    assert [c["name"] for c in template["spec"]["initContainers"]] == ["istio-init"]
    # Exactly what the webhook would make of that pod template.
    original = yaml.safe_load(DEPLOYMENT.split("---")[0])["spec"]["template"]
    original["metadata"]["namespace"] = "shop"
    _, patch = injection_patch(
        original,
        {"istio-injection": "enabled"},
        load_template(),
        InjectionValues(pilot_address="istiod.mesh:15012"),
    )
    expected = apply_patch(original, patch)
    del expected["metadata"]["namespace"]
    assert template == expected
    assert template["metadata"]["annotations"]["prometheus.io/port"] == "15020"
    # The opted-out pod and the Service pass through unchanged.
    docs = list(yaml.safe_load_all(DEPLOYMENT))
    assert pod == docs[1] and service == docs[2]
    # The result is a valid Deployment for the Kubernetes schema.
    from kubernetes.client import ApiClient

    api = ApiClient()
    model = api._ApiClient__deserialize(deployment, "V1Deployment")  # type: ignore[attr-defined]
    assert api.sanitize_for_serialization(model)["spec"]["template"]["spec"]["initContainers"]


def test_kube_inject_from_a_file_with_a_template_file(tmp_path: Path) -> None:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "app", "image": "app"}]},
    }
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump(pod))
    (tmp_path / "t.yaml").write_text(
        "containers: [{name: istio-proxy, image: mine, env: [{name: PILOT_ADDRESS, value: x}]}]"
    )
    r = kube_inject(
        "-f", str(tmp_path / "pod.yaml"), "--injection-template", str(tmp_path / "t.yaml")
    )
    assert r.returncode == 0, r.stderr
    out = yaml.safe_load(r.stdout)
    assert out["spec"]["containers"][1]["image"] == "mine"
    assert "namespace" not in out["metadata"]


def test_kube_inject_errors_are_one_line() -> None:
    for args, stdin, message in [
        (("-f", "/nonexistent.yaml"), "", "No such file"),
        (("-f", "-"), "a: [", "not YAML"),
        (("-f", "-"), "- 1\n", "not a Kubernetes object"),
        (
            ("-f", "-"),
            "kind: Pod\nmetadata: {name: p, annotations: {sidecar.istio.io/interceptionMode: X}}\n"
            "spec: {containers: [{name: a}]}\n",
            "Pod p: annotation sidecar.istio.io/interceptionMode",
        ),
    ]:
        r = kube_inject(*args, stdin=stdin)
        assert r.returncode == 1 and message in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and r.stdout == ""


def test_already_injected_output_is_stable() -> None:
    template = load_template()
    once = inject_documents(DEPLOYMENT, template, InjectionValues())
    assert inject_documents(once, template, InjectionValues()) == once


def test_kube_inject_start_order_flags_and_annotations() -> None:
    r = kube_inject("-f", "-", "--hold-application-until-proxy-starts", stdin=DEPLOYMENT)
    assert r.returncode == 0, r.stderr
    spec = next(yaml.safe_load_all(r.stdout))["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["istio-proxy", "web"]
    assert spec["containers"][0]["lifecycle"]["postStart"] == {
        "exec": {"command": ["pilotfish-agent", "wait"]}
    }
    r = kube_inject("-f", "-", "--native-sidecars", stdin=DEPLOYMENT)
    assert r.returncode == 0, r.stderr
    spec = next(yaml.safe_load_all(r.stdout))["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["web"]
    assert [(c["name"], c.get("restartPolicy")) for c in spec["initContainers"]] == [
        ("istio-init", None),
        ("istio-proxy", "Always"),
    ]
    bad = DEPLOYMENT.replace(
        "sidecar.istio.io/interceptionMode: REDIRECT",
        "proxy.istio.io/config: 'holdApplicationUntilProxyStarts: 3'",
    )
    r = kube_inject("-f", "-", stdin=bad)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().endswith("holdApplicationUntilProxyStarts: 3 is not true or false")
