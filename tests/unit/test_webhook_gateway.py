"""Injection with Istio's `gateway` template (`inject.istio.io/templates: gateway`): the
agent runs as a router, nothing is captured, and its listeners bind every address."""

from __future__ import annotations

from agent.config import build_parser, config_from_args
from tests.unit.test_webhook_inject import app_pod, env_of, injected


def test_gateway_template_runs_the_agent_as_a_router() -> None:
    pod = app_pod(
        # As Istio's gateway Deployments ask for it: the inject label, the gateway template.
        labels={"istio": "ingressgateway", "sidecar.istio.io/inject": "true"},
        annotations={"inject.istio.io/templates": "gateway"},
        namespace="istio-system",
    )
    out = injected(pod, None)
    assert "initContainers" not in out["spec"]  # a gateway is addressed, not captured
    (agent,) = [c for c in out["spec"]["containers"] if c["name"] == "istio-proxy"]
    assert agent["args"][-2:] == ["--proxy-type", "router"]
    env = env_of(agent)
    assert env["ISTIO_META_INTERCEPTION_MODE"] == "REDIRECT"
    assert "istio=ingressgateway" in env["ISTIO_META_LABELS"]
    # What the container runs is a valid agent command line for a router.
    cfg = config_from_args(build_parser().parse_args(agent["args"]), {})
    assert cfg.is_router


def test_other_templates_leave_a_sidecar() -> None:
    pod = app_pod(annotations={"inject.istio.io/templates": "sidecar"})
    out = injected(pod)
    (agent,) = [c for c in out["spec"]["containers"] if c["name"] == "istio-proxy"]
    assert "--proxy-type" not in agent["args"]
