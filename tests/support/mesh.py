"""Mesh config and agents that e2e tests and benchmarks share: a backend (Service, Sidecar and
the WorkloadGroup its agents register through) and agents on the TLS port that join a group
with a token of its service account (DESIGN: in file mode a connected agent registers its
workload only through a WorkloadGroup)."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

from control.app import ControlPlane
from tests.support.agentproc import AgentProcess
from tests.support.controlplane import agent_token

# Service `web` over one WorkloadEntry at `{web_ip}` (str.format).
WEB_YAML = """\
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default}}
spec:
  selector: {{app: web}}
  ports: [{{name: http, port: 9080, targetPort: 8080}}]
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: web-1, namespace: default}}
spec: {{address: "{web_ip}", labels: {{app: web}}}}
"""

# A Sidecar whose egress listener is bound to an address this machine does not have: the
# YAML is valid, but Envoy cannot bind the listener and rejects the LDS update (a NACK).
UNBINDABLE_SIDECAR = """\
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: default}
spec:
  egress:
  - port: {number: 9080, protocol: HTTP, name: http}
    bind: 192.0.2.10
    hosts: ["./*"]
"""


def workload_group_yaml(
    name: str,
    namespace: str = "default",
    *,
    service_account: str | None = None,
    labels: Mapping[str, str] | None = None,
    ports: Mapping[str, int] | None = None,
) -> str:
    """A WorkloadGroup whose members get `labels` (default `app: <name>`) and run as
    `service_account` (default: the group's name)."""
    labels = dict(labels) if labels is not None else {"app": name}
    lines = [
        "apiVersion: networking.istio.io/v1",
        "kind: WorkloadGroup",
        f"metadata: {{name: {name}, namespace: {namespace}}}",
        "spec:",
        "  metadata:",
        "    labels: {" + ", ".join(f'"{k}": "{v}"' for k, v in labels.items()) + "}",
        "  template:",
        f"    serviceAccount: {service_account or name}",
    ]
    if ports:
        lines.append("    ports: {" + ", ".join(f"{k}: {v}" for k, v in ports.items()) + "}")
    return "\n".join(lines) + "\n"


def backend_yaml(
    name: str = "backend",
    namespace: str = "default",
    *,
    port: int = 9080,
    app_port: int = 8080,
    service_account: str | None = None,
) -> str:
    """Service `name` (port `port`, HTTP) over workloads labelled `app: <name>`; a Sidecar
    whose inbound listener on `port` forwards to the app at the pod IP, port `app_port`;
    and the WorkloadGroup `name` (service account `service_account`, default `name`) that
    the backend's agents join."""
    return textwrap.dedent(
        f"""\
            apiVersion: v1
            kind: Service
            metadata: {{name: {name}, namespace: {namespace}}}
            spec:
              selector: {{app: {name}}}
              ports: [{{name: http, port: {port}, targetPort: {port}}}]
            ---
            apiVersion: networking.istio.io/v1
            kind: Sidecar
            metadata: {{name: {name}, namespace: {namespace}}}
            spec:
              workloadSelector: {{labels: {{app: {name}}}}}
              ingress:
              - port: {{number: {port}, protocol: HTTP, name: http}}
                defaultEndpoint: 0.0.0.0:{app_port}
            ---
            """
    ) + workload_group_yaml(name, namespace, service_account=service_account)


def root_file(cp: ControlPlane, directory: Path) -> Path:
    """The control plane's root certificate in `directory` (what an agent verifies the TLS
    port by: --ca-root-cert)."""
    assert cp.ca is not None, "the control plane has not started"
    path = directory / "root-cert.pem"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(cp.ca.root_pem)
    return path


def tls_agent(
    target: str,
    root: Path,
    token: str,
    workdir: Path,
    ip: str,
    pod: str,
    labels: str = "",
    *extra: str,
    group: str = "",
    service_account: str | None = None,
    namespace: str = "default",
    env: dict[str, str] | None = None,
    wrap: Sequence[str] = (),
    log_path: Path | None = None,
) -> AgentProcess:
    """An agent (not started) on the TLS port `target`, verifying it by `root`, presenting
    `token` (of `namespace`/`service_account`; default: the group's name, else `default`);
    `group`: the WorkloadGroup it registers in ("" = a client only)."""
    account = service_account or group or "default"
    args = ["--namespace", namespace, "--service-account", account, "--ca-root-cert", str(root)]
    if group:
        args += ["--workload-group", group]
    return AgentProcess(
        target,
        workdir,
        ip,
        pod,
        labels,
        *args,
        *extra,
        token=token,
        env=env,
        wrap=wrap,
        log_path=log_path,
    )


def mesh_agent(
    cp: ControlPlane,
    tmp_path: Path,
    ip: str,
    pod: str,
    labels: str = "",
    *extra: str,
    group: str = "",
    service_account: str | None = None,
    namespace: str = "default",
    host: str = "127.0.0.1",
    env: dict[str, str] | None = None,
    wrap: Sequence[str] = (),
    log_path: Path | None = None,
    workdir: Path | None = None,
) -> AgentProcess:
    """`tls_agent` on a running in-process control plane's TLS port (reached at `host`),
    with a token it issues; the workdir is `tmp_path/<pod>` unless given."""
    account = service_account or group or "default"
    return tls_agent(
        f"{host}:{cp.secure_xds_port}",
        root_file(cp, tmp_path),
        agent_token(cp, namespace, account),
        workdir or tmp_path / pod,
        ip,
        pod,
        labels,
        *extra,
        group=group,
        service_account=account,
        namespace=namespace,
        env=env,
        wrap=wrap,
        log_path=log_path,
    )
