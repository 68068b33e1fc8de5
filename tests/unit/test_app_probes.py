"""App probe rewriting without sockets: what the injector does to each probe kind (through
an AdmissionReview), the opt-out annotation, the errors it gives; and the agent's strict
reading of ISTIO_KUBE_APP_PROBERS and the headers it forwards."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from agent.config import AgentConfigError, build_parser, config_from_args
from agent.health.appprobe import forwarded_headers, probe_destination
from agent.health.appprobers import AppProber, AppProbersError, parse_app_probers
from control.webhook.inject import injection_patch
from control.webhook.jsonpatch import apply_patch
from control.webhook.review import review_response
from control.webhook.template import load_template
from control.webhook.values import InjectionError, InjectionValues

TEMPLATE = load_template()
ENABLED = {"istio-injection": "enabled"}


def pod(*containers: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "web-1", "namespace": "shop", "labels": {"app": "web"}}
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": list(containers)},
    }


def proxy_env(out: dict[str, Any]) -> dict[str, str]:
    proxy = next(c for c in out["spec"]["containers"] if c["name"] == "istio-proxy")
    return {e["name"]: e.get("value", "") for e in proxy["env"]}


def reviewed(p: dict[str, Any], values: InjectionValues = InjectionValues()) -> dict[str, Any]:
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u1",
            "kind": {"kind": "Pod"},
            "namespace": "shop",
            "operation": "CREATE",
            "object": p,
        },
    }
    answer = review_response(review, lambda ns: ENABLED, TEMPLATE, values)["response"]
    assert answer["allowed"], answer
    return apply_patch(p, json.loads(base64.b64decode(answer["patch"])))


def test_https_probe_becomes_http_to_the_agent_and_keeps_its_scheme_for_the_app() -> None:
    web = {
        "name": "web",
        "livenessProbe": {
            "httpGet": {"path": "healthz", "port": 8443, "scheme": "HTTPS", "host": "10.0.0.9"},
            "initialDelaySeconds": 7,
        },
    }
    out = reviewed(pod(web))
    probe = out["spec"]["containers"][0]["livenessProbe"]
    assert probe == {
        "httpGet": {"path": "/app-health/web/livez", "port": 15020},
        "initialDelaySeconds": 7,
    }
    probers = json.loads(proxy_env(out)["ISTIO_KUBE_APP_PROBERS"])
    assert probers == {
        "/app-health/web/livez": {
            "httpGet": {"path": "healthz", "port": 8443, "scheme": "HTTPS", "host": "10.0.0.9"}
        }
    }
    # The agent reads what the injector wrote.
    parsed = parse_app_probers(proxy_env(out)["ISTIO_KUBE_APP_PROBERS"])
    assert parsed["/app-health/web/livez"] == AppProber(
        "httpGet", 8443, 1.0, path="/healthz", https=True
    )


def test_probes_are_rewritten_before_the_agent_is_inserted_first() -> None:
    """With hold, istio-proxy goes to index 0: the probe patches must still hit the app."""
    web = {"name": "web", "readinessProbe": {"tcpSocket": {"port": 80}}}
    hold = {"proxy.istio.io/config": "holdApplicationUntilProxyStarts: true"}
    out = reviewed(pod({"name": "side"}, web, annotations=hold))
    names = [c["name"] for c in out["spec"]["containers"]]
    assert names == ["istio-proxy", "side", "web"]
    assert (
        out["spec"]["containers"][2]["readinessProbe"]["httpGet"]["path"]
        == "/app-health/web/readyz"
    )
    assert "readinessProbe" not in out["spec"]["containers"][1]
    assert out["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/healthz/ready"


@pytest.mark.parametrize("value", ["false", "False", "0"])
def test_opt_out_annotation(value: str) -> None:
    web = {"name": "web", "readinessProbe": {"tcpSocket": {"port": 80}}}
    out = reviewed(pod(web, annotations={"sidecar.istio.io/rewriteAppHTTPProbers": value}))
    assert out["spec"]["containers"][0]["readinessProbe"] == {"tcpSocket": {"port": 80}}
    assert "ISTIO_KUBE_APP_PROBERS" not in proxy_env(out)
    # The mesh-wide default off, a pod turning it on.
    out = reviewed(
        pod(web, annotations={"sidecar.istio.io/rewriteAppHTTPProbers": "true"}),
        InjectionValues(rewrite_app_probes=False),
    )
    assert "ISTIO_KUBE_APP_PROBERS" in proxy_env(out)


def test_no_probes_no_env() -> None:
    out = reviewed(pod({"name": "web", "livenessProbe": {"exec": {"command": ["true"]}}}))
    assert "ISTIO_KUBE_APP_PROBERS" not in proxy_env(out)


@pytest.mark.parametrize(
    ("container", "annotations", "message"),
    [
        (
            {"name": "web", "readinessProbe": {"httpGet": {"port": "web"}}},
            {},
            "'web' is not a named port",
        ),
        (
            {"name": "web", "readinessProbe": {"tcpSocket": {"port": 70000}}},
            {},
            "not a port number",
        ),
        (
            {"name": "web", "readinessProbe": {"tcpSocket": {"port": 80}, "httpGet": {"port": 80}}},
            {},
            "more than one of",
        ),
        (
            {"name": "web"},
            {"sidecar.istio.io/rewriteAppHTTPProbers": "nope"},
            'is not "true" or "false"',
        ),
    ],
)
def test_unusable_probes_refuse_the_pod(
    container: dict[str, Any], annotations: dict[str, str], message: str
) -> None:
    with pytest.raises(InjectionError, match=message):
        injection_patch(pod(container, annotations=annotations), ENABLED, TEMPLATE)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1]", "expected a JSON object"),
        ('{"/app-health/web/readyz": 3}', "expected an object"),
        ('{"/app-health/web/ready": {"tcpSocket": {"port": 80}}}', "not a path"),
        ('{"/app-health/web/readyz": {}}', "exactly one of"),
        ('{"/app-health/web/readyz": {"tcpSocket": {"port": "http"}}}', "not a port number"),
        (
            '{"/app-health/web/readyz": {"tcpSocket": {"port": 80}, "timeoutSeconds": -1}}',
            "timeoutSeconds",
        ),
        (
            '{"/app-health/web/readyz": {"httpGet": {"port": 80, "scheme": "FTP"}}}',
            "not HTTP or HTTPS",
        ),
        (
            '{"/app-health/w/readyz": {"httpGet": {"port": 8, "httpHeaders": [{"name": "a:"}]}}}',
            "bad header",
        ),
        (
            '{"/app-health/web/readyz": {"grpc": {"port": 80, "extra": 1}}}',
            "unsupported field extra",
        ),
    ],
)
def test_app_probers_parsed_strictly(text: str, message: str) -> None:
    with pytest.raises(AppProbersError, match=message):
        parse_app_probers(text)


def test_bad_probers_are_a_config_error() -> None:
    args = build_parser().parse_args([])
    with pytest.raises(AgentConfigError, match="ISTIO_KUBE_APP_PROBERS: not valid JSON"):
        config_from_args(args, {"ISTIO_KUBE_APP_PROBERS": "{"})
    cfg = config_from_args(
        args, {"ISTIO_KUBE_APP_PROBERS": '{"/app-health/a/livez": {"grpc": {"port": 9}}}'}
    )
    assert cfg.app_probers == {"/app-health/a/livez": AppProber("grpc", 9)}


def test_forwarded_headers() -> None:
    prober = AppProber("httpGet", 8080, headers=(("X-Token", "t"), ("host", "app.local")))
    got = forwarded_headers(
        prober,
        {
            "host": "10.1.2.3:15020",
            "user-agent": "kube-probe/1.31",
            "connection": "close",
            "x-token": "old",
        },
        15020,
    )
    assert dict((k.lower(), v) for k, v in got) == {
        "host": "app.local",  # the probe's own Host wins
        "user-agent": "kube-probe/1.31",
        "x-token": "t",
    }
    plain = AppProber("httpGet", 8080)
    assert ("host", "[fd00::5]:8080") in forwarded_headers(
        plain, {"host": "[fd00::5]:15020"}, 15020
    )
    assert ("host", "10.1.2.3:9999") in forwarded_headers(plain, {"host": "10.1.2.3:9999"}, 15020)


def test_probe_destination() -> None:
    assert probe_destination("10.1.2.3", False) == "10.1.2.3"
    assert probe_destination("10.1.2.3", True) == "127.0.0.1"
    assert probe_destination("fd00::5", True) == "::1"
