"""An Istio `WorkloadGroup`: the template that workloads registered by connected proxies are
made from (auto-registration). The group, not the proxy, says what a workload is: its labels,
ports and service account; a proxy may only join a group whose identity it proves."""

from __future__ import annotations

from dataclasses import dataclass, field

from control.model.types import Labels, SourceRef

# Istio's annotation on an auto-registered WorkloadEntry naming the group it came from.
GROUP_ANNOTATION = "istio.io/autoRegistrationGroup"


@dataclass(frozen=True, slots=True)
class WorkloadProbe:
    """`spec.probe` (Istio's ReadinessProbe). Sent to the members' agents
    (control/generate/probes.py), which run it and report health; a member serves only once
    healthy (control/registry/autoregister.py). `exec` is not run (the loader warns)."""

    kind: str  # "httpGet", "tcpSocket", "exec" or "grpc"
    port: int = 0
    host: str = ""
    path: str = ""  # httpGet
    scheme: str = ""  # httpGet: HTTP or HTTPS
    headers: tuple[tuple[str, str], ...] = ()  # httpGet
    command: tuple[str, ...] = ()  # exec
    service: str = ""  # grpc
    initial_delay_seconds: int = 0
    timeout_seconds: int = 1
    period_seconds: int = 10
    success_threshold: int = 1
    failure_threshold: int = 3


@dataclass(frozen=True, slots=True)
class WorkloadGroup:
    namespace: str
    name: str
    source: SourceRef = field(compare=False)
    # The workload's labels: `template.labels` with `metadata.labels` over them (Istio's order).
    labels: Labels = ()
    annotations: Labels = ()  # `metadata.annotations`, copied onto registered entries
    service_account: str = "default"
    ports: tuple[tuple[str, int], ...] = ()
    locality: str = ""
    weight: int = 0
    probe: WorkloadProbe | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)
