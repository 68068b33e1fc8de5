"""ResponseHandlers end to end (issue 24): a real control plane, real agents with real Envoy,
plug-ins found through the `pilotfish.agent.handlers` entry-point group.

- consume: a plug-in (a dist-info on the agent's path) handles Cluster, Listener,
  RouteConfiguration, ClusterLoadAssignment and TypedExtensionConfig (a type no part of the
  agent imports); its exception is a NACK whose text shows in the control plane's
  /debug/syncz; the agent still holds one TCP connection; /debug/handlers and the metrics say
  what ran.
- observe: the example package (examples/handlers, pip-installed offline) sees every Listener
  response relayed to Envoy while traffic through the pod flows; its failing check is no NACK.
  The same package in consume mode NACKs.
- a plug-in registering an unknown type: the agent exits 1 with one line naming it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from envoy.config.core.v3.extension_pb2 import TypedExtensionConfig
from envoy.extensions.filters.http.router.v3.router_pb2 import Router
from envoy.service.runtime.v3.rtds_pb2 import Runtime

from control import generate
from control.app import ControlPlane
from control.generate.context import GenContext
from control.model.proxy import Proxy as ProxyModel
from control.xds.cache import ResourceSet
from protos import typeurls
from tests.e2e.test_agent_pods import _ok, get
from tests.e2e.test_security_pods import tcp_connections_to
from tests.support.agentproc import AgentProcess
from tests.support.apps import EchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.mesh import backend_yaml, mesh_agent
from tests.support.net import pod_ip

pytestmark = pytest.mark.envoy

ROOT = Path(__file__).resolve().parents[2]
ECDS = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"
RTDS = "type.googleapis.com/envoy.service.runtime.v3.Runtime"
CONSUMED = {
    typeurls.CLUSTER: "envoy.config.cluster.v3.Cluster",
    typeurls.LISTENER: "envoy.config.listener.v3.Listener",
    typeurls.ROUTE: "envoy.config.route.v3.RouteConfiguration",
    typeurls.ENDPOINT: "envoy.config.endpoint.v3.ClusterLoadAssignment",
    ECDS: "envoy.config.core.v3.TypedExtensionConfig",
    # Runtime discovery: a type whose module nothing in the agent imports (checked below).
    RTDS: "envoy.service.runtime.v3.Runtime",
}

# A plug-in that records what it is given (type, decoded class, names) and rejects clusters.
RECORDER = textwrap.dedent(
    """\
    import json, os, sys

    TYPES = {types!r}

    def _handler(type_url):
        def handle(resources):
            with open(os.environ["PF_RECORD_FILE"], "a") as f:
                f.write(json.dumps({{
                    "type": type_url,
                    "classes": sorted({{r.DESCRIPTOR.full_name for r in resources}}),
                    "names": sorted(getattr(r, "name", "") or getattr(r, "cluster_name", "")
                                    for r in resources),
                }}) + "\\n")
            if type_url.endswith(".Cluster"):
                raise ValueError("clusters are audited elsewhere")
        return handle

    def setup(registry):
        with open(os.environ["PF_RECORD_FILE"], "a") as f:
            loaded = sorted(m for m in sys.modules if m.endswith("rtds_pb2"))
            f.write(json.dumps({{"type": "setup", "loaded": loaded}}) + "\\n")
        for type_url in TYPES:
            registry.register(type_url, _handler(type_url))
    """
)


def plugin_path(directory: Path, dist: str, module: str, entry: str, source: str) -> Path:
    """`directory` holding `module.py` and a dist-info declaring it as entry point `entry` of
    the handlers group: what an installed plug-in looks like on the agent's sys.path."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{module}.py").write_text(source)
    info = directory / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[pilotfish.agent.handlers]\n{entry} = {module}:setup\n"
    )
    return directory


def install_example(tmp_path: Path) -> Path:
    """pip-install examples/handlers (offline, no build isolation) into a directory of its
    own; a copy is built so that the source tree gets no build/ or egg-info."""
    source = tmp_path / "example-src"
    shutil.copytree(ROOT / "examples" / "handlers", source)
    target = tmp_path / "example-site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    return target


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the Prometheus text (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{" if labels else name + " "):
            sample, _, value = line.rpartition(" ")
            got = sample[len(name) :].strip("{}")
            if ",".join(sorted(got.split(","))) == want or not labels:
                return float(value)
    return 0.0


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def stream_rows(cp: ControlPlane, ip: str, type_url: str) -> list[dict[str, Any]]:
    rows = []
    for entry in cp.views.syncz():
        if entry["proxy"].split("~")[1] == ip and type_url in entry["types"]:
            rows.append(entry["types"][type_url])
    return rows


def serve_extension_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control plane has no config kind that makes ECDS or RTDS yet (Istio's WasmPlugin):
    give its real server generators for the types, one resource each per proxy."""

    def ecds(ctx: GenContext, proxy: ProxyModel) -> ResourceSet:
        def build() -> TypedExtensionConfig:
            tec = TypedExtensionConfig(name="default.router")
            tec.typed_config.Pack(Router())
            return tec

        return ResourceSet([ctx.resource(ECDS, "default.router", "ecds-test", build)])

    def rtds(ctx: GenContext, proxy: ProxyModel) -> ResourceSet:
        def build() -> Runtime:
            layer = Runtime(name="layer0")
            layer.layer.update({"re2.max_program_size.error_level": 200})
            return layer

        return ResourceSet([ctx.resource(RTDS, "layer0", "rtds-test", build)])

    monkeypatch.setitem(generate.GENERATORS, ECDS, ecds)
    monkeypatch.setitem(generate.GENERATORS, RTDS, rtds)


def last_nack(cp: ControlPlane, ip: str, type_url: str) -> str:
    """The NACK text of the pod's stream for `type_url` while it is in ERROR, else ""."""
    for row in stream_rows(cp, ip, type_url):
        if row["status"] == "ERROR":
            return str(row["last_nack"])
    return ""


async def test_consuming_plug_in_gets_every_type_decoded_and_its_error_is_a_nack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve_extension_configs(monkeypatch)
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(backend_yaml())
    ip = pod_ip()
    record = tmp_path / "record.jsonl"
    site = plugin_path(
        tmp_path / "site",
        "pf-recorder",
        "pf_recorder",
        "recorder",
        RECORDER.format(types=list(CONSUMED)),
    )
    async with running_control_plane(cfg) as cp:
        agent = mesh_agent(
            cp,
            tmp_path,
            ip,
            "client",
            "app=client",
            env={"PYTHONPATH": str(site), "PF_RECORD_FILE": str(record)},
        )
        agent.start()
        try:
            await eventually(
                lambda: {r["type"] for r in records(record)} >= set(CONSUMED),
                timeout=30,
                what="a response of every consumed type",
            )
            seen = records(record)
            for type_url, message in CONSUMED.items():
                classes = {c for r in seen if r["type"] == type_url for c in r["classes"]}
                assert classes == {message}, (type_url, classes)
            # The types the control plane computes for this pod arrive with their resources.
            names = {t: {n for r in seen if r["type"] == t for n in r["names"]} for t in CONSUMED}
            assert f"{ip}_9080" in names[typeurls.LISTENER]
            backend = "outbound|9080||backend.default.svc.cluster.local"
            assert backend in names[typeurls.CLUSTER]
            assert backend in names[typeurls.ENDPOINT]
            assert "9080" in names[typeurls.ROUTE]
            assert names[ECDS] == {"default.router"}
            assert names[RTDS] == {"layer0"}
            # Decoded although the agent had not imported its module when the plug-in loaded.
            assert [r["loaded"] for r in seen if r["type"] == "setup"] == [[]]

            message = await eventually(
                lambda: last_nack(cp, ip, typeurls.CLUSTER), timeout=20, what="CDS NACK in syncz"
            )
            assert "clusters are audited elsewhere" in message
            # ...and over HTTP, as an operator reads it.
            _, body = await get(f"http://127.0.0.1:{cp.http_port}/debug/syncz")
            assert "ValueError: clusters are audited elsewhere" in body
            # Listeners were ACKed, not NACKed.
            assert all(r["status"] != "ERROR" for r in stream_rows(cp, ip, typeurls.LISTENER))

            assert agent.proc is not None
            assert tcp_connections_to(agent.proc.pid, cp.secure_xds_port) == 1

            status, body = await get(f"http://{ip}:15020/debug/handlers")
            assert status == 200
            listed = {h["type_url"]: h for h in json.loads(body)}
            assert set(listed) >= set(CONSUMED)
            for type_url in CONSUMED:
                assert listed[type_url]["handler"] == "recorder"
                assert listed[type_url]["package"] == "pf-recorder"
                assert listed[type_url]["mode"] == "consume"
            assert listed[typeurls.CLUSTER]["nacks"] >= 1

            _, stats = await get(f"http://{ip}:15020/stats/prometheus")
            assert (
                metric(
                    stats,
                    "pilotfish_agent_handler_rejections_total",
                    handler="recorder",
                    type="Cluster",
                )
                >= 1
            )
            assert (
                metric(
                    stats,
                    "pilotfish_agent_handler_duration_seconds_count",
                    handler="recorder",
                    type="TypedExtensionConfig",
                )
                >= 1
            )
        finally:
            agent.kill()


async def test_observing_example_sees_every_listener_response_and_never_nacks(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(backend_yaml())
    site = install_example(tmp_path)
    client_ip, backend_ip, consumer_ip = pod_ip(), pod_ip(), pod_ip()
    audit = tmp_path / "audit.jsonl"
    app = EchoApp("backend", backend_ip, 8080)
    await app.start()
    async with running_control_plane(cfg) as cp:
        backend = mesh_agent(cp, tmp_path, backend_ip, "backend", "app=backend", group="backend")
        # Observe (the default), with a check that always fails: logged and counted only.
        client = mesh_agent(
            cp,
            tmp_path,
            client_ip,
            "client",
            "app=client",
            env={
                "PYTHONPATH": str(site),
                "LISTENER_AUDIT_FILE": str(audit),
                "LISTENER_AUDIT_REQUIRE": "no-such-listener",
            },
        )
        # The same package consuming: the failed check is the NACK.
        consumer = mesh_agent(
            cp,
            tmp_path,
            consumer_ip,
            "consumer",
            "app=consumer",
            env={
                "PYTHONPATH": str(site),
                "LISTENER_AUDIT_MODE": "consume",
                "LISTENER_AUDIT_REQUIRE": "no-such-listener",
            },
        )
        for a in (backend, client, consumer):
            a.start()
        try:
            await eventually(
                lambda: _ok(get(f"http://{client_ip}:15020/healthz/ready")),
                timeout=30,
                what="client ready",
            )
            status, body = await eventually(
                lambda: _ok(get(f"http://{client_ip}:9080/hello", "backend")),
                timeout=20,
                what="client -> backend through the observed pod",
            )
            assert json.loads(body)["app"] == "backend"

            # Every Listener response the agent relayed to Envoy was observed.
            async def observed_all() -> float | None:
                _, stats = await get(f"http://{client_ip}:15020/stats/prometheus")
                relayed = metric(stats, "istio_agent_xds_proxy_responses_total", type="Listener")
                lines = records(audit)
                return relayed if relayed >= 1 and len(lines) == relayed else None

            relayed = await eventually(observed_all, timeout=20, what="observer caught up")
            lines = records(audit)
            assert all(line["mode"] == "observe" for line in lines)
            assert f"{client_ip}_9080" in lines[-1]["listeners"]
            _, stats = await get(f"http://{client_ip}:15020/stats/prometheus")
            assert (
                metric(
                    stats,
                    "pilotfish_agent_handler_observe_errors_total",
                    handler="listener-audit",
                    type="Listener",
                )
                == relayed
            )

            # Envoy ACKed its listeners; the observer's failures NACKed nothing (a NACK would
            # hold the row in ERROR until the next push).
            def synced() -> bool:
                rows = stream_rows(cp, client_ip, typeurls.LISTENER)
                return bool(rows) and all(r["status"] == "SYNCED" for r in rows)

            await eventually(synced, timeout=20, what="client's LDS SYNCED")
            assert last_nack(cp, client_ip, typeurls.LISTENER) == ""
            _, body = await get(f"http://{client_ip}:15020/debug/handlers")
            listed = {h["type_url"]: h for h in json.loads(body)}
            entry = listed[typeurls.LISTENER]
            assert (entry["handler"], entry["package"], entry["mode"]) == (
                "listener-audit",
                "pilotfish-example-handlers",
                "observe",
            )
            # The agent's own DNS handler is listed too, as the agent's.
            assert listed[typeurls.NAME_TABLE]["package"] == "pilotfish"

            message = await eventually(
                lambda: last_nack(cp, consumer_ip, typeurls.LISTENER),
                timeout=20,
                what="consumer's LDS NACK",
            )
            assert "missing listeners: no-such-listener" in message
        finally:
            for a in (client, consumer, backend):
                a.kill()
    await app.close()


async def test_plug_in_registering_an_unknown_type_stops_the_agent_with_one_line(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(backend_yaml())
    bad = "type.googleapis.com/envoy.config.cluster.v3.NoSuchCluster"
    site = plugin_path(
        tmp_path / "site",
        "pf-bad-types",
        "pf_bad_types",
        "bad-types",
        f"def setup(registry):\n    registry.register({bad!r}, print)\n",
    )
    async with running_control_plane(cfg) as cp:
        agent: AgentProcess = mesh_agent(
            cp, tmp_path, pod_ip(), "bad", "app=bad", env={"PYTHONPATH": str(site)}
        )
        agent.start()
        assert agent.proc is not None
        code = await asyncio.to_thread(agent.proc.wait, 30)
        log = agent.log()
        assert code == 1, log
        errors = [line for line in log.splitlines() if line.startswith("pilotfish-agent:")]
        assert len(errors) == 1, log
        assert "handler plug-in bad-types (pf-bad-types)" in errors[0]
        assert repr(bad) in errors[0]
        assert "Traceback" not in log
