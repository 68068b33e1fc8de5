"""An agent with Envoy, on the control plane's TLS port with a token, logs its start
timeline once ready, and the timeline shows the start order that keeps it short: Envoy is
started from a fork before the event loop and gRPC exist (agent/envoy/earlystart.py), its
sockets bound after it while it starts (agent/launch.py), Envoy's xDS socket is served before
the rest of the agent is imported, the status server once those imports are done, and
readiness comes after the certificate, the first xDS response and the name table
(tests/benchmarks/ca.py times the same phases)."""

from __future__ import annotations

import re
from pathlib import Path

from agent.httpio import fetch
from tests.support.agentproc import AgentProcess
from tests.support.controlplane import agent_token, eventually, running_control_plane
from tests.support.net import pod_ip

MESH = """\
apiVersion: v1
kind: Service
metadata: {name: backend, namespace: default}
spec:
  selector: {app: backend}
  ports: [{name: http, port: 9080, targetPort: 9080}]
"""


async def test_the_start_timeline_is_logged_in_start_order(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    async with running_control_plane(cfg) as cp:
        assert cp.ca is not None
        root = tmp_path / "root.pem"
        root.write_text(cp.ca.root_pem)
        ip = pod_ip()
        agent = AgentProcess(
            f"127.0.0.1:{cp.secure_xds_port}",
            tmp_path / "pod",
            ip,
            "client-0",
            "app=client",
            "--service-account",
            "client",
            "--ca-root-cert",
            str(root),
            token=agent_token(cp, "default", "client"),
        )
        agent.start()
        try:

            async def ready() -> bool:
                try:
                    status, _ = await fetch(f"http://{ip}:15020/healthz/ready", timeout=2)
                except (OSError, TimeoutError):
                    return False
                return status == 200

            await eventually(ready, timeout=60, what="agent ready")
            line = await eventually(
                lambda: re.search(r"start timeline \(ms after [\d.]+\): (.*)", agent.log()),
                what="start timeline logged",
            )
        finally:
            agent.terminate()
    marks = {
        name: float(ms) for name, _, ms in (p.rpartition(" ") for p in line.group(1).split(", "))
    }
    # Envoy was exec'd from a fork before the event loop existed (agent/envoy/earlystart.py),
    # not through the launcher the agent falls back to.
    assert "envoy launcher" not in marks and "envoy spawned" not in marks, marks
    order = [
        "envoy started",
        "xds served",
        "imports",
        "serving",
        "status server",
        "ready",
    ]
    assert [n for n in marks if n in order] == order, marks
    for later in ("csr signed", "first xds response", "name table"):
        assert marks["envoy started"] < marks[later] <= marks["ready"], (later, marks)
