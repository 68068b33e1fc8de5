"""Sidecar injection as a pure function (control/webhook/inject.py, review.py), no sockets:
who is injected (namespace label, pod label/annotation, opt-out), what the patch adds (the
template's agent container with its env and volumes, the capture init container only for
REDIRECT), that the patched pod is a valid Kubernetes pod, and the AdmissionReview round."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from control.webhook.decision import STATUS_ANNOTATION, decide
from control.webhook.inject import injection_patch
from control.webhook.jsonpatch import apply_patch
from control.webhook.review import ReviewError, review_response
from control.webhook.template import TemplateError, load_template, parse_template
from control.webhook.values import PROMETHEUS_ANNOTATIONS, InjectionError, InjectionValues

TEMPLATE = load_template()
ENABLED = {"istio-injection": "enabled"}


def app_pod(
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    namespace: str = "shop",
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": "web-1",
        "namespace": namespace,
        "labels": labels or {"app": "web"},
    }
    if annotations is not None:
        meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "serviceAccountName": "web",
            "containers": [{"name": "web", "image": "web:1", "ports": [{"containerPort": 8080}]}],
        },
    }


def injected(
    pod: dict[str, Any], ns_labels: dict[str, str] | None = ENABLED, **values: str
) -> dict[str, Any]:
    decision, patch = injection_patch(pod, ns_labels, TEMPLATE, InjectionValues(**values))
    assert decision.inject, decision.reason
    return apply_patch(pod, patch)


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.mark.parametrize(
    ("ns_labels", "labels", "annotations", "inject"),
    [
        (ENABLED, {}, None, True),
        ({}, {}, None, False),
        (None, {}, None, False),
        ({}, {"sidecar.istio.io/inject": "true"}, None, True),
        (ENABLED, {"sidecar.istio.io/inject": "false"}, None, False),  # opt-out label
        (ENABLED, {}, {"sidecar.istio.io/inject": "false"}, False),  # opt-out annotation
        # the label wins over the annotation, as in Istio
        (ENABLED, {"sidecar.istio.io/inject": "true"}, {"sidecar.istio.io/inject": "false"}, True),
        ({"istio-injection": "disabled"}, {"sidecar.istio.io/inject": "true"}, None, False),
        (ENABLED, {}, {STATUS_ANNOTATION: "{}"}, False),  # already injected
    ],
)
def test_who_is_injected(
    ns_labels: dict[str, str] | None,
    labels: dict[str, str],
    annotations: dict[str, str] | None,
    inject: bool,
) -> None:
    pod = app_pod({"app": "web", **labels}, annotations)
    assert decide(pod, ns_labels).inject is inject


def test_never_host_network_or_system_namespaces() -> None:
    pod = app_pod()
    pod["spec"]["hostNetwork"] = True
    assert not decide(pod, ENABLED).inject
    assert not decide(app_pod(namespace="kube-system"), ENABLED).inject


def test_patch_adds_the_agent_container_with_env_volumes_and_status() -> None:
    pod = app_pod({"app": "web", "version": "v1"})
    out = injected(pod, pilot_address="istiod.mesh.svc:15012", image="registry/agent:9")
    names = [c["name"] for c in out["spec"]["containers"]]
    assert names == ["web", "istio-proxy"]
    agent = out["spec"]["containers"][1]
    assert agent["image"] == "registry/agent:9"
    env = env_of(agent)
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["INSTANCE_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["SERVICE_ACCOUNT"] == {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}
    assert env["PILOT_ADDRESS"] == "istiod.mesh.svc:15012"
    assert env["ISTIO_META_LABELS"] == "app=web,security.istio.io/tlsMode=istio,version=v1"
    assert "ISTIO_META_INTERCEPTION_MODE" not in env
    volumes = {v["name"]: v for v in out["spec"]["volumes"]}
    token = volumes["istio-token"]["projected"]["sources"][0]["serviceAccountToken"]
    assert token["audience"] == "istio-ca"
    assert "emptyDir" in volumes["istio-envoy"]
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    assert mounts["istio-envoy"] == agent["args"][agent["args"].index("--workdir") + 1]
    assert "initContainers" not in out["spec"]  # NONE: no capture
    status = json.loads(out["metadata"]["annotations"][STATUS_ANNOTATION])
    assert status["containers"] == ["istio-proxy"] and "istio-token" in status["volumes"]
    assert out["metadata"]["labels"]["security.istio.io/tlsMode"] == "istio"
    assert pod["spec"]["containers"] == [out["spec"]["containers"][0]]  # input untouched
    # The patched pod is a valid Pod for the Kubernetes schema (the models' round trip).
    from kubernetes.client import ApiClient

    api = ApiClient()
    model = api._ApiClient__deserialize(out, "V1Pod")  # type: ignore[attr-defined]
    assert api.sanitize_for_serialization(model)["spec"]["containers"][1]["name"] == "istio-proxy"


def test_template_defaults_are_kept_when_no_values_are_given() -> None:
    out = injected(app_pod())
    agent = out["spec"]["containers"][1]
    template_agent = next(c for c in TEMPLATE.containers if c["name"] == "istio-proxy")
    assert agent["image"] == template_agent["image"]
    assert env_of(agent)["PILOT_ADDRESS"] == env_of(dict(template_agent))["PILOT_ADDRESS"]


def test_redirect_adds_the_capture_init_container_first_with_annotation_args() -> None:
    pod = app_pod(
        annotations={
            "sidecar.istio.io/interceptionMode": "REDIRECT",
            "traffic.sidecar.istio.io/excludeOutboundIPRanges": "10.0.0.0/8, 169.254.169.254",
            "traffic.sidecar.istio.io/excludeInboundPorts": "9901",
        }
    )
    pod["spec"]["initContainers"] = [{"name": "migrate", "image": "migrate:1"}]
    out = injected(pod)
    inits = out["spec"]["initContainers"]
    assert [c["name"] for c in inits] == ["istio-init", "migrate"]
    init = inits[0]
    assert init["command"] == ["pilotfish-agent"]
    args = init["args"]
    assert args[0] == "iptables"
    assert args[args.index("--exclude-outbound-ip-ranges") + 1] == "10.0.0.0/8,169.254.169.254"
    # Istio adds the annotation's ports to the agent's own, never capturing those.
    assert args[args.index("--exclude-inbound-ports") + 1] == "15000,15020,15021,15090,9901"
    assert {"NET_ADMIN", "NET_RAW"} <= set(init["securityContext"]["capabilities"]["add"])
    agent = out["spec"]["containers"][1]
    assert env_of(agent)["ISTIO_META_INTERCEPTION_MODE"] == "REDIRECT"
    status = json.loads(out["metadata"]["annotations"][STATUS_ANNOTATION])
    assert status["initContainers"] == ["istio-init"]


def test_the_init_container_args_are_the_agents_iptables_command() -> None:
    from agent.capture.cli import build_parser

    pod = app_pod(
        annotations={
            "sidecar.istio.io/interceptionMode": "REDIRECT",
            "traffic.sidecar.istio.io/includeInboundPorts": "*",
            "traffic.sidecar.istio.io/excludeOutboundPorts": "3306",
        }
    )
    init = injected(pod)["spec"]["initContainers"][0]
    parsed = build_parser().parse_args(init["args"][1:])
    assert parsed.exclude_outbound_ports == "3306" and parsed.include_inbound_ports == "*"


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({"sidecar.istio.io/interceptionMode": "TPROXY"}, "TPROXY"),
        (
            {
                "sidecar.istio.io/interceptionMode": "REDIRECT",
                "traffic.sidecar.istio.io/excludeInboundPorts": "http",
            },
            "'http' is not a port",
        ),
        (
            {
                "sidecar.istio.io/interceptionMode": "REDIRECT",
                "traffic.sidecar.istio.io/excludeOutboundIPRanges": "10.0.0.0/33",
            },
            "not an IP range",
        ),
    ],
)
def test_bad_annotations_are_clear_errors(annotations: dict[str, str], message: str) -> None:
    with pytest.raises(InjectionError, match=message):
        injection_patch(app_pod(annotations=annotations), ENABLED, TEMPLATE)


def test_volume_name_clash_is_an_error() -> None:
    pod = app_pod()
    pod["spec"]["volumes"] = [{"name": "istio-envoy", "emptyDir": {}}]
    with pytest.raises(InjectionError, match="volume named istio-envoy"):
        injection_patch(pod, ENABLED, TEMPLATE)


def test_patch_paths_escape_label_keys_and_append_to_existing_lists() -> None:
    pod = app_pod(annotations={"team": "a"})
    pod["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    _, patch = injection_patch(pod, ENABLED, TEMPLATE)
    paths = [op["path"] for op in patch]
    assert "/metadata/annotations/sidecar.istio.io~1status" in paths
    assert "/metadata/labels/security.istio.io~1tlsMode" in paths
    assert "/spec/volumes/-" in paths and "/spec/volumes" not in paths
    out = apply_patch(pod, patch)
    assert out["metadata"]["annotations"]["team"] == "a"
    assert next(v["name"] for v in out["spec"]["volumes"]) == "data"


ISTIO_SCRAPE = {
    "prometheus.io/scrape": "true",
    "prometheus.io/port": "15020",
    "prometheus.io/path": "/stats/prometheus",
}


def scrape_annotations(pod: dict[str, Any], **values: Any) -> dict[str, str]:
    decision, patch = injection_patch(pod, ENABLED, TEMPLATE, InjectionValues(**values))
    assert decision.inject
    out = apply_patch(pod, patch)["metadata"].get("annotations") or {}
    return {k: v for k, v in out.items() if "prometheus" in k}


@pytest.mark.parametrize("annotations", [None, {}, {"team": "a"}, {"prometheus.io/scrape": "true"}])
def test_injected_pods_are_scraped_at_the_agents_merged_metrics(
    annotations: dict[str, str] | None,
) -> None:
    """As Istio's metrics merge: Prometheus scrapes the agent's status port, which serves
    Envoy's and the agent's metrics (the standard istio_* ones among them)."""
    assert PROMETHEUS_ANNOTATIONS == ISTIO_SCRAPE
    pod = app_pod(annotations=annotations)
    assert scrape_annotations(pod) == ISTIO_SCRAPE
    if annotations:  # the pod's other annotations stay
        out = injected(app_pod(annotations=annotations))
        assert out["metadata"]["annotations"].items() >= annotations.items() - {
            ("prometheus.io/scrape", "true")
        }


@pytest.mark.parametrize(
    ("annotations", "values"),
    [
        # The pod opts out of scraping (any spelling Prometheus reads as the same label).
        ({"prometheus.io/scrape": "false"}, {}),
        ({"prometheus-io/scrape": "False"}, {}),
        # The pod opts out of the merge, or the mesh turned it off (enablePrometheusMerge).
        ({"prometheus.istio.io/merge-metrics": "false"}, {}),
        ({}, {"prometheus_merge": False}),
        # The pod's own scrape target is kept (our agent does not scrape and merge the app's).
        ({"prometheus.io/port": "9100", "prometheus.io/path": "/metrics"}, {}),
        ({"prometheus.io/path": "/app-metrics"}, {}),
    ],
)
def test_scrape_annotations_the_pod_set_are_not_overridden(
    annotations: dict[str, str], values: dict[str, Any]
) -> None:
    pod = app_pod(annotations=annotations)
    assert scrape_annotations(pod, **values) == {
        k: v for k, v in annotations.items() if "prometheus" in k
    }


def test_merge_metrics_annotation_can_turn_it_on_against_the_mesh_default() -> None:
    pod = app_pod(annotations={"prometheus.istio.io/merge-metrics": "true"})
    got = scrape_annotations(pod, prometheus_merge=False)
    assert got == {**ISTIO_SCRAPE, "prometheus.istio.io/merge-metrics": "true"}


def test_a_bad_merge_metrics_annotation_is_a_clear_error() -> None:
    pod = app_pod(annotations={"prometheus.istio.io/merge-metrics": "maybe"})
    with pytest.raises(InjectionError, match=r'merge-metrics: .maybe. is not "true" or "false"'):
        injection_patch(pod, ENABLED, TEMPLATE)


def test_template_errors() -> None:
    with pytest.raises(TemplateError, match="no container named 'istio-proxy'"):
        parse_template("containers: [{name: other}]")
    with pytest.raises(TemplateError, match=r"data\['sidecar\.yaml'\]"):
        parse_template("kind: ConfigMap\ndata: {}\n")
    with pytest.raises(TemplateError, match=r"(?i)no such file"):
        load_template("/nonexistent/template.yaml")


def review(pod: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": operation,
            "object": pod,
        },
    }


def test_admission_review_round() -> None:
    pod = app_pod()
    del pod["metadata"]["name"], pod["metadata"]["namespace"]  # as a Deployment's pods come
    pod["metadata"]["generateName"] = "web-7d9c-"
    answer = review_response(review(pod), {"shop": ENABLED}.get, TEMPLATE)
    response = answer["response"]
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    assert "istio-proxy" in [c["name"] for c in apply_patch(pod, patch)["spec"]["containers"]]
    # Not labelled: allowed, no patch. An UPDATE: never patched.
    plain = review_response(review(app_pod()), {}.get, TEMPLATE)["response"]
    assert plain["allowed"] is True and "patch" not in plain
    update = review_response(review(app_pod(), "UPDATE"), {"shop": ENABLED}.get, TEMPLATE)
    assert "patch" not in update["response"]
    bad = app_pod(annotations={"sidecar.istio.io/interceptionMode": "bogus"})
    refused = review_response(review(bad), {"shop": ENABLED}.get, TEMPLATE)["response"]
    assert refused["allowed"] is False and "BOGUS" in refused["status"]["message"]
    with pytest.raises(ReviewError):
        review_response({"apiVersion": "admission.k8s.io/v1beta1"}, {}.get, TEMPLATE)
