"""examples/observability against the real thing: promtool checks both scrape configs, a real
Prometheus scrapes a real control plane and an injected pod's agent with them (the Kubernetes
job's relabelling fed the annotations the injector really sets), and every PromQL expression of
the Grafana dashboards (and the one `make demo` prints) is accepted by that Prometheus and names
only metrics and labels that Pilotfish exports: Istio's standard istio_* set, and the pilot_*,
citadel_*, process_* and sidecar_injection_* families a running control plane's /metrics shows.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from agent.telemetry.labels import HTTP_LABELS
from control.app import ControlPlane
from control.webhook.inject import injection_patch
from control.webhook.jsonpatch import apply_patch
from control.webhook.template import load_template
from tests.support.controlplane import eventually, running_control_plane
from tests.support.mesh import mesh_agent
from tests.support.net import pod_ip
from tests.support.promserver import promtool_binary, running_prometheus
from tests.support.promtext import parse

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "examples" / "observability"
DASHBOARDS = sorted((HERE / "dashboards").glob("*.json"))

# Istio's standard metrics (what the agent serves on /stats/prometheus) and their labels.
ISTIO_HISTOGRAMS = (
    "istio_request_duration_milliseconds",
    "istio_request_bytes",
    "istio_response_bytes",
)
ISTIO_STANDARD = {
    "istio_requests_total",
    "istio_tcp_sent_bytes_total",
    "istio_tcp_received_bytes_total",
    "istio_tcp_connections_opened_total",
    "istio_tcp_connections_closed_total",
    *(f"{h}_{s}" for h in ISTIO_HISTOGRAMS for s in ("bucket", "sum", "count")),
}
# The standard metrics' labels, as the agent exports them (Istio's names).
ISTIO_LABELS = set(HTTP_LABELS)
# Labels the scrape configs add, and the control plane's metrics' own.
SCRAPE_LABELS = {"app", "namespace", "pod", "instance", "job", "le"}
CONTROL_LABELS = {"type", "version", "event", "tag", "component", "node", "err"}
# Grafana's template variables, as a user would pick them.
VARIABLES = {
    "service": "web.default.svc.cluster.local",
    "qrep": "destination",
    "namespace": "default",
    "workload": "web",
}
PROMQL_WORDS = {
    "sum",
    "rate",
    "irate",
    "round",
    "histogram_quantile",
    "absent",
    "vector",
    "time",
    "max",
    "min",
    "by",
    "or",
    "and",
    "unless",
    "without",
    "label_values",
}

# Control plane panels that must show data as soon as one proxy is connected.
LIVE_PANELS = {
    "Control plane versions",
    "Memory",
    "CPU",
    "xDS pushes by type",
    "Push time by type",
    "Config size by type",
    "ADS monitoring",
    "Connected proxies by version",
}

WEB = """\
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  selector: {app: web}
  ports: [{name: http, port: 9080, targetPort: 8080}]
"""


def load(name: str) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((HERE / name).read_text())
    return config


def kubernetes_job_with(targets: list[dict[str, Any]]) -> dict[str, Any]:
    """prometheus.yml's pod job, its pods given as static targets carrying the labels
    Kubernetes service discovery would give them (Debian's Prometheus is built without
    kubernetes_sd; the relabelling, which is the part that decides, runs as written)."""
    job = copy.deepcopy(load("prometheus.yml")["scrape_configs"][0])
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
    del job["kubernetes_sd_configs"]
    job["static_configs"] = targets
    return job


def discovered_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """A static target as `kubernetes_sd_configs: role: pod` discovers a pod with one
    container port: its address, and annotations and labels sanitized into label names."""
    meta, ip = pod["metadata"], pod["status"]["podIP"]
    port = pod["spec"]["containers"][0]["ports"][0]["containerPort"]

    def name(key: str) -> str:
        return re.sub(r"[^a-zA-Z0-9_]", "_", key)

    labels = {
        "__meta_kubernetes_namespace": meta["namespace"],
        "__meta_kubernetes_pod_name": meta["name"],
        "__meta_kubernetes_pod_ip": ip,
        "__meta_kubernetes_pod_phase": pod["status"]["phase"],
        **{
            f"__meta_kubernetes_pod_annotation_{name(k)}": v for k, v in meta["annotations"].items()
        },
        **{f"__meta_kubernetes_pod_label_{name(k)}": v for k, v in meta["labels"].items()},
    }
    return {"targets": [f"{ip}:{port}"], "labels": labels}


def injected_pod(ip: str) -> dict[str, Any]:
    """What the sidecar injector makes of a plain pod (the real patch)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web-1", "namespace": "default", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "web", "ports": [{"containerPort": 8080}]}]},
    }
    decision, patch = injection_patch(pod, {"istio-injection": "enabled"}, load_template())
    assert decision.inject
    out = apply_patch(pod, patch)
    out["status"] = {"podIP": ip, "phase": "Running"}
    return out


def test_scrape_configs_pass_promtool(tmp_path: Path) -> None:
    static = load("prometheus.yml")
    static["scrape_configs"] = [kubernetes_job_with([{"targets": ["127.0.0.1:8080"]}])]
    (tmp_path / "kubernetes.yml").write_text(yaml.safe_dump(static))
    for path in (HERE / "prometheus-local.yml", tmp_path / "kubernetes.yml"):
        r = subprocess.run(
            [promtool_binary(), "check", "config", str(path)], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert "SUCCESS" in r.stdout + r.stderr


async def test_prometheus_scrapes_the_control_plane_and_an_injected_pod(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "web.yaml").write_text(WEB)
    async with running_control_plane(cfg) as cp:
        ip = pod_ip()
        agent = mesh_agent(cp, tmp_path, ip, "web-1", "app=web", "--proxy-only")
        agent.start()
        try:
            config = load("prometheus-local.yml")
            config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
            control, pods = config["scrape_configs"]
            assert control["static_configs"][0]["targets"] == ["127.0.0.1:15014"]
            control["static_configs"][0]["targets"] = [f"127.0.0.1:{cp.http_port}"]
            pods["static_configs"] = [
                {"targets": [f"{ip}:15020"], "labels": {"app": "web", "pod": "web-1"}}
            ]
            config["scrape_configs"].append(kubernetes_job_with([discovered_pod(injected_pod(ip))]))
            async with running_prometheus(config, tmp_path / "prometheus") as prom:

                async def all_up() -> bool:
                    up = await prom.vector("up == 1")
                    return {r["metric"]["job"] for r in up} == {
                        "pilotfish-control",
                        "pilotfish-pods",
                        "kubernetes-pods",
                    }

                await eventually(all_up, timeout=30, what="every target scraped")
                # The injector's annotations, relabelled as in Kubernetes: the agent's status
                # port and path on the pod IP, with the pod's labels.
                targets = (await prom.api("targets"))["data"]["activeTargets"]
                pod = next(t for t in targets if t["labels"]["job"] == "kubernetes-pods")
                assert pod["scrapeUrl"] == f"http://{ip}:15020/stats/prometheus"
                assert pod["health"] == "up", pod
                assert {k: pod["labels"][k] for k in ("app", "namespace", "pod")} == {
                    "app": "web",
                    "namespace": "default",
                    "pod": "web-1",
                }
                # The control plane's metrics under Istio's names, labelled app="istiod".
                services = await prom.vector('pilot_services{app="istiod"}')
                assert [r["value"][1] for r in services] == ["1"]
                connected = await eventually(
                    lambda: prom.vector('sum(pilot_xds{app="istiod"}) >= 1'),
                    what="the agent's streams in pilot_xds",
                )
                assert connected
                meta = (await prom.api("metadata", metric="pilot_xds_pushes"))["data"]
                assert meta["pilot_xds_pushes"][0]["type"] == "counter"
                # The control plane dashboard's core panels show data from this scrape.
                board = json.loads((HERE / "dashboards/pilotfish-control-plane.json").read_text())
                for panel in board["panels"]:
                    if panel["title"] not in LIVE_PANELS:
                        continue
                    for target in panel["targets"]:

                        async def has_data(expr: str = target["expr"]) -> bool:
                            return bool(await prom.vector(expr))

                        await eventually(has_data, timeout=20, what=f"{panel['title']}: data")
        finally:
            agent.terminate()


def expressions(board: dict[str, Any]) -> list[str]:
    out = [t["expr"] for p in board["panels"] for t in p.get("targets", ())]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            out.append(var["query"]["query"])
    return out


def with_variables(expr: str) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: VARIABLES[m.group(1)], expr)


def names_and_labels(expr: str) -> tuple[set[str], set[str]]:
    """The metric names and label names a PromQL expression uses."""
    labels = set()
    for matchers in re.findall(r"\{([^}]*)\}", expr):
        labels |= set(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", matchers))
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        labels |= {g.strip() for g in group.split(",") if g.strip()}
    label_values = re.findall(r"label_values\([^,]*,\s*(\w+)\)", expr)
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    bare = re.sub(r"\{[^}]*\}", "", bare)
    bare = re.sub(r"\b(?:by|without)\s*\([^)]*\)", "", bare)
    bare = re.sub(r"\[[^\]]*\]", "", bare)
    words = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b", bare))
    names = words - PROMQL_WORDS - set(label_values)
    return names, labels | set(label_values)


def exported_names(metrics_text: str) -> set[str]:
    out = set()
    for name, kind in parse(metrics_text).types.items():
        out |= (
            {f"{name}_{s}" for s in ("bucket", "sum", "count")} if kind == "histogram" else {name}
        )
    return out


async def control_plane_metrics(cp: ControlPlane) -> str:
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{cp.http_port}/metrics") as r,
    ):
        assert r.status == 200
        return await r.text()


def demo_query() -> str:
    sys.path.insert(0, str(ROOT / "examples" / "local"))
    try:
        import demo

        query: str = demo.TRAFFIC_QUERY
        return query
    finally:
        sys.path.pop(0)


def test_dashboards_are_grafana_json() -> None:
    assert {p.stem for p in DASHBOARDS} == {
        "pilotfish-mesh",
        "pilotfish-service",
        "pilotfish-workload",
        "pilotfish-control-plane",
    }
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        assert board["uid"] == path.stem and board["title"].startswith("Pilotfish / ")
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), path
        variables = {v["name"] for v in board["templating"]["list"]}
        for panel in board["panels"]:
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"] and all(t["expr"] and t["refId"] for t in panel["targets"])
            for target in panel["targets"]:
                used = set(re.findall(r"\$\{?(\w+)\}?", target["expr"]))
                assert used <= variables, (path.name, target["expr"])
    for name in ("datasource.yaml", "dashboards.yaml"):
        assert yaml.safe_load((HERE / "grafana" / name).read_text())["apiVersion"] == 1


async def test_dashboard_queries_parse_and_use_only_exported_metrics(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "web.yaml").write_text(WEB)
    async with running_control_plane(cfg) as cp:
        control = exported_names(await control_plane_metrics(cp))
    allowed_names = ISTIO_STANDARD | control
    allowed_labels = ISTIO_LABELS | SCRAPE_LABELS | CONTROL_LABELS
    queries = [(p.name, e) for p in DASHBOARDS for e in expressions(json.loads(p.read_text()))]
    queries.append(("make demo", demo_query()))
    assert len(queries) > 50
    config = {"global": {"scrape_interval": "15s"}, "scrape_configs": []}
    async with running_prometheus(config, tmp_path / "prometheus") as prom:
        for where, expr in queries:
            names, labels = names_and_labels(expr)
            assert names, (where, expr)
            assert names <= allowed_names, (where, expr, names - allowed_names)
            assert labels <= allowed_labels, (where, expr, labels - allowed_labels)
            if expr.startswith("label_values("):
                continue  # Grafana's variable query, not PromQL; its parts are checked above
            answer = await prom.query(with_variables(expr))
            assert answer["status"] == "success", (where, expr, answer)


async def test_bad_promql_is_refused_by_the_checking_prometheus(tmp_path: Path) -> None:
    """The check above can fail: Prometheus refuses what it cannot parse."""
    config = {"global": {"scrape_interval": "15s"}, "scrape_configs": []}
    async with running_prometheus(config, tmp_path / "prometheus") as prom:
        answer = await prom.query("sum(rate(istio_requests_total[1m]) by (le")
        assert answer["status"] == "error" and answer["errorType"] == "bad_data"
    names, labels = names_and_labels('sum(rate(made_up_total{reporter="x"}[1m])) by (le)')
    assert names == {"made_up_total"} and labels == {"reporter", "le"}


@pytest.mark.parametrize("name", ["prometheus.yml", "prometheus-local.yml"])
def test_scrape_configs_scrape_the_agents_merged_metrics(name: str) -> None:
    text = (HERE / name).read_text()
    assert "/stats/prometheus" in text and "15020" in text
