"""Access logs end to end: two pods (agent + real Envoy + app), config from the control plane.

- MeshConfig `accessLogFile` (TEXT, Istio's default format): one line per request on each
  side, with method, path, code, response flags, upstream cluster and duration where Istio
  puts them; switched on and off by editing the mesh config while the proxies keep running;
  a broken mesh config is a `file:line` error and the last good one stays in force.
- `accessLogEncoding: JSON` to /dev/stdout (the agent's stdout, as a container log): every
  line is one JSON object with Istio's labels.
- Telemetry: `filter.expression: response.code >= 400` logs only the errors; `disabled:
  true` on one workload silences it.

A negative ("nothing was logged") is shown without sleeping: after the requests that must not
be logged, logging is switched on again for the same file and a marker request is sent; Envoy
writes a file's entries in order, so once the marker is there every earlier entry would be.
"""

from __future__ import annotations

import json
import logging
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from control.app import ControlPlane
from tests.support.agentproc import AgentProcess
from tests.support.apps import EchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.envoyadmin import draining, dynamic_listeners, file_loggers, status_of
from tests.support.mesh import backend_yaml, mesh_agent
from tests.support.net import pod_ip

pytestmark = pytest.mark.envoy

BACKEND_CLUSTER = "outbound|9080||backend.default.svc.cluster.local"

# Istio's default TEXT format, field by field (control/generate/access_logs.py).
TEXT_LINE = re.compile(
    r'^\[(?P<start>[^\]]+)\] "(?P<method>\S+) (?P<path>\S+) (?P<protocol>\S+)" '
    r"(?P<code>\d+) (?P<flags>\S+) (?P<details>\S+) (?P<termination>\S+) "
    r'"(?P<failure>[^"]*)" (?P<received>\d+) (?P<sent>\d+) (?P<duration>\d+) (?P<service_time>\S+) '
    r'"(?P<xff>[^"]*)" "(?P<user_agent>[^"]*)" "(?P<request_id>[^"]*)" "(?P<authority>[^"]*)" '
    r'"(?P<upstream_host>[^"]*)" (?P<cluster>\S+) (?P<upstream_local>\S+) '
    r"(?P<downstream_local>\S+) (?P<downstream_remote>\S+) (?P<sni>\S+) (?P<route>\S+)$"
)


def text_entries(text: str) -> list[dict[str, str]]:
    return [m.groupdict() for m in map(TEXT_LINE.match, text.splitlines()) if m]


def json_entries(text: str) -> list[dict[str, object]]:
    """The lines of an agent's output that are access log entries (JSON objects with Istio's
    labels); every such line must be valid JSON on its own."""
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            entry = json.loads(line)  # raises: not valid JSON per line
            if "response_code" in entry:
                out.append(entry)
    return out


async def get(url: str, host: str = "backend") -> int:
    return await status_of(url, host)


async def listener_loggers(ip: str) -> int:
    """How many access loggers (file or stdout) the pod's Envoy runs in its listeners now."""
    dump = await dynamic_listeners(ip)
    if dump is None:
        return -1
    return file_loggers(dump) + dump.count("access_loggers.stream.v3.StdoutAccessLog")


async def settled(ip: str, logging_on: bool) -> bool:
    """The pod's Envoy runs the listeners with (or without) access loggers, and nothing from
    before the change is left: every connection from now on is served by the new config."""
    loggers = await listener_loggers(ip)
    return (loggers > 0 if logging_on else loggers == 0) and await draining(ip) == 0


class Pods:
    def __init__(self, client: AgentProcess, backend: AgentProcess, client_ip: str) -> None:
        self.client, self.backend, self.client_ip = client, backend, client_ip

    def url(self, path: str) -> str:
        return f"http://{self.client_ip}:9080{path}"


async def start_pods(cp: ControlPlane, tmp_path: Path, client_ip: str, backend_ip: str) -> Pods:
    backend = mesh_agent(cp, tmp_path, backend_ip, "backend", "app=backend", group="backend")
    client = mesh_agent(cp, tmp_path, client_ip, "client", "app=client")
    backend.start()
    client.start()
    pods = Pods(client, backend, client_ip)
    await eventually(
        lambda: _is(get(pods.url("/warmup")), 200), timeout=40, what="client -> backend"
    )
    return pods


async def _is(call: object, want: int) -> bool:
    return bool(await call == want)  # type: ignore[misc]


def write(path: Path, text: str) -> None:
    # Replace in one step, as kubectl and editors do, so the watcher never reads half a file.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(textwrap.dedent(text))
    tmp.replace(path)


@pytest.fixture
def pods_dir(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(backend_yaml())
    yield cfg, tmp_path / "meshconfig.yaml"


async def test_text_access_log_hot_reload_and_broken_mesh_config(
    tmp_path: Path, pods_dir: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    cfg, mesh_file = pods_dir
    log_file = tmp_path / "access.log"
    mesh_file.write_text("enableTracing: false\n")  # no access log yet
    client_ip, backend_ip = pod_ip(), pod_ip()
    app = EchoApp("backend", backend_ip, 8080)
    await app.start()
    async with running_control_plane(cfg, mesh_config=mesh_file) as cp:
        pods = await start_pods(cp, tmp_path, client_ip, backend_ip)
        try:
            assert await listener_loggers(client_ip) == 0
            assert (await get(pods.url("/before"))) == 200
            # On: every listener of both proxies gets the logger, no restart.
            write(mesh_file, f"accessLogFile: {log_file}\n")
            for ip in (client_ip, backend_ip):
                await eventually(lambda ip=ip: settled(ip, True), timeout=30, what="logging on")
            for i in range(3):
                assert await get(pods.url(f"/hello/{i}?q=1")) == 200
            assert await get(pods.url("/nowhere"), host="unknown.example") == 404
            # Each Envoy flushes its entries on its own schedule: wait for both sides.
            entries = await eventually(
                lambda: _entries_with(log_file, "/hello/2?q=1", 2, "/nowhere"),
                timeout=20,
                what="access log",
            )
            client_side = [e for e in entries if e["cluster"] == BACKEND_CLUSTER]
            server_side = [e for e in entries if e["cluster"] == "inbound|9080||"]
            # One line per request on each side, none for the request made before.
            assert sorted(e["path"] for e in client_side) == [f"/hello/{i}?q=1" for i in range(3)]
            assert sorted(e["path"] for e in server_side) == [f"/hello/{i}?q=1" for i in range(3)]
            assert not [e for e in entries if e["path"] == "/before"]
            for e in client_side + server_side:
                assert e["method"] == "GET" and e["code"] == "200" and e["flags"] == "-"
                assert e["protocol"] == "HTTP/1.1" and int(e["duration"]) >= 0
                assert e["authority"] == "backend"
            assert {e["upstream_host"] for e in client_side} == {f"{backend_ip}:9080"}
            assert {e["upstream_host"] for e in server_side} == {f"{backend_ip}:8080"}
            # No route for that host: Envoy's own 404 with response flag NR, no cluster.
            (nowhere,) = [e for e in entries if e["path"] == "/nowhere"]
            assert (nowhere["code"], nowhere["flags"], nowhere["cluster"]) == ("404", "NR", "-")
            # The request ids join the two sides of one request.
            assert {e["request_id"] for e in client_side} == {e["request_id"] for e in server_side}

            # A broken mesh config: `file:line`, and the last good one stays (still logging).
            caplog.set_level(logging.ERROR, logger="control.config.meshwatch")
            write(mesh_file, f"accessLogFile: {log_file}\naccessLogEncoding: XML\n")
            await eventually(lambda: cp.mesh.errors, timeout=10, what="mesh config error")
            (error,) = cp.mesh.errors.values()
            assert str(error).startswith(f"{mesh_file}:2: ") and "accessLogEncoding" in str(error)
            assert any(f"{mesh_file}:2:" in r.getMessage() for r in caplog.records)
            assert await get(pods.url("/still-logged")) == 200
            await eventually(lambda: _entries_with(log_file, "/still-logged", 2), timeout=20)

            # Off: the loggers go, the proxies stay (same agent, same Envoy).
            write(mesh_file, "accessLogFile: ''\n")
            for ip in (client_ip, backend_ip):
                await eventually(lambda ip=ip: settled(ip, False), timeout=30, what="logging off")
            assert not cp.mesh.errors
            for i in range(3):
                assert await get(pods.url(f"/unlogged/{i}")) == 200
            write(mesh_file, f"accessLogFile: {log_file}\n")
            for ip in (client_ip, backend_ip):
                await eventually(lambda ip=ip: settled(ip, True), timeout=30, what="logging on")
            assert await get(pods.url("/marker")) == 200
            entries = await eventually(lambda: _entries_with(log_file, "/marker", 2), timeout=20)
            assert not [e for e in entries if e["path"].startswith("/unlogged")]
            for agent in (pods.client, pods.backend):
                assert agent.proc is not None and agent.proc.poll() is None
                assert agent.log().count("started Envoy pid") == 1
        finally:
            pods.client.kill()
            pods.backend.kill()
    await app.close()


async def test_json_to_stdout_filter_and_disabled_workload(
    tmp_path: Path, pods_dir: tuple[Path, Path]
) -> None:
    cfg, mesh_file = pods_dir
    mesh_file.write_text("accessLogFile: /dev/stdout\naccessLogEncoding: JSON\n")
    client_ip, backend_ip = pod_ip(), pod_ip()
    app = EchoApp("backend", backend_ip, 8080)
    await app.start()
    async with running_control_plane(cfg, mesh_config=mesh_file) as cp:
        pods = await start_pods(cp, tmp_path, client_ip, backend_ip)
        try:
            # JSON, one object per line, Istio's labels.
            for i in range(3):
                assert await get(pods.url(f"/json/{i}")) == 200
            for agent, cluster in (
                (pods.client, BACKEND_CLUSTER),
                (pods.backend, "inbound|9080||"),
            ):
                entries = await eventually(
                    lambda agent=agent: _json_with(agent, "/json/2"), timeout=20, what="JSON log"
                )
                mine = [e for e in entries if str(e["path"]).startswith("/json/")]
                assert sorted(str(e["path"]) for e in mine) == ["/json/0", "/json/1", "/json/2"]
                for e in mine:
                    assert e["method"] == "GET" and e["response_code"] == 200
                    assert e["upstream_cluster"] == cluster and e["response_flags"] == "-"
                    assert isinstance(e["duration"], int) and "request_id" in e

            # A Telemetry filter: only the errors are logged (TEXT: the `envoy` provider).
            app.fail_every, app.fail_status = 2, 503
            (cfg / "telemetry.yaml").write_text(
                textwrap.dedent(
                    """\
                    apiVersion: telemetry.istio.io/v1
                    kind: Telemetry
                    metadata: {name: errors-only, namespace: default}
                    spec:
                      accessLogging:
                      - providers: [{name: envoy}]
                        filter: {expression: "response.code >= 400"}
                    """
                )
            )
            for ip in (client_ip, backend_ip):
                await eventually(lambda ip=ip: _filtered(ip, True), timeout=30, what="filter")
            app.requests = 0
            codes = [await get(pods.url(f"/mixed/{i}")) for i in range(6)]
            assert sorted(codes) == [200, 200, 200, 503, 503, 503]
            assert await get(pods.url("/mixed/none"), host="unknown.example") == 404
            failed = {f"/mixed/{i}" for i, c in enumerate(codes) if c == 503}
            client_entries = await eventually(
                lambda: _text_with(pods.client, "/mixed/none"), timeout=20, what="error log"
            )
            logged = [e for e in client_entries if e["path"].startswith("/mixed/")]
            assert {e["path"] for e in logged} == failed | {"/mixed/none"}
            assert all(int(e["code"]) >= 400 for e in logged)
            server_entries = await eventually(
                lambda: _text_with(pods.backend, max(failed), want=len(failed)), timeout=20
            )
            assert {e["path"] for e in server_entries if e["path"].startswith("/mixed/")} == failed

            # disabled: true on the backend silences it; the client still logs.
            app.fail_every = 0
            (cfg / "quiet.yaml").write_text(
                textwrap.dedent(
                    """\
                    apiVersion: telemetry.istio.io/v1
                    kind: Telemetry
                    metadata: {name: quiet-backend, namespace: default}
                    spec:
                      selector: {matchLabels: {app: backend}}
                      accessLogging:
                      - disabled: true
                    """
                )
            )
            await eventually(lambda: settled(backend_ip, False), timeout=30, what="silenced")
            (cfg / "telemetry.yaml").unlink()  # the client logs everything again (JSON)
            await eventually(lambda: _filtered(client_ip, False), timeout=30, what="no filter")
            for i in range(3):
                assert await get(pods.url(f"/quiet/{i}")) == 200
            client_json = await eventually(lambda: _json_with(pods.client, "/quiet/2"), timeout=20)
            assert len([e for e in client_json if str(e["path"]).startswith("/quiet/")]) == 3
            (cfg / "quiet.yaml").unlink()
            await eventually(lambda: settled(backend_ip, True), timeout=30, what="logging on")
            assert await get(pods.url("/marker")) == 200
            backend_json = await eventually(lambda: _json_with(pods.backend, "/marker"), timeout=20)
            assert not [e for e in backend_json if str(e["path"]).startswith("/quiet/")]
        finally:
            pods.client.kill()
            pods.backend.kill()
    await app.close()


async def _filtered(ip: str, want: bool) -> bool:
    """The pod's Envoy logs through a status-code filter (or not), settled."""
    dump = await dynamic_listeners(ip)
    return dump is not None and ("status_code_filter" in dump) == want and await draining(ip) == 0


def _entries_with(path: Path, marker: str, want: int, *also: str) -> list[dict[str, str]] | None:
    """The entries of a log file once `marker` appears `want` times in its paths (and every
    path in `also` at least once)."""
    try:
        entries = text_entries(path.read_text())
    except FileNotFoundError:
        return None
    paths = [e["path"] for e in entries]
    if paths.count(marker) < want or any(p not in paths for p in also):
        return None
    return entries


def _json_with(agent: AgentProcess, marker: str) -> list[dict[str, object]] | None:
    entries = json_entries(agent.log())
    return entries if any(e["path"] == marker for e in entries) else None


def _text_with(agent: AgentProcess, marker: str, want: int = 1) -> list[dict[str, str]] | None:
    entries = text_entries(agent.log())
    return (
        entries
        if sum(e["path"].startswith("/mixed/") for e in entries) >= want
        and any(e["path"] == marker for e in entries)
        else None
    )
