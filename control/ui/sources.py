"""Where the dashboard's data come from: the graph's samples from `--prometheus-url`'s HTTP
API or scraped from the connected agents' status ports; in Kubernetes mode, the proxies of
every replica (the control-plane pods of this namespace, asked on the plaintext xDS port they
share, as pilotfish-ctl proxy-status finds them); Gateway API status as configz shows it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from control.debugaccess import own_namespace
from control.gatewayapi import status as gateway_status
from control.kube.client import KubeClient
from control.model.gatewayapi import GROUP as GATEWAY_API_GROUP
from control.model.proxy import Proxy
from control.model.types import MeshConfig
from control.ui.dashboard import ConfigView, Dashboard, MetricsSource
from control.ui.details import DetailIndex
from control.ui.promapi import PrometheusSource
from control.ui.replicas import DEFAULT_SELECTOR, ReplicaRows, kube_replicas
from control.ui.routes import UiRoutes
from control.ui.scrape import AgentScraper, scrape_targets


@dataclass(frozen=True, slots=True)
class DashboardInputs:
    """What the control plane hands the dashboard: read-only views, each a callable."""

    proxies: Callable[[], Iterable[Proxy]]  # the connected proxies
    syncz: Callable[[], list[dict[str, Any]]]
    config: ConfigView
    index: Callable[[], DetailIndex]
    kube_client: Callable[[], KubeClient | None]
    xds_port: Callable[[], int]  # the plaintext xDS port, once bound


def dashboard_routes(
    inputs: DashboardInputs, *, prometheus_url: str, kubernetes: bool, replica_id: str
) -> UiRoutes:
    """/ui/: metrics from `prometheus_url`, or scraped from the connected agents."""
    source: MetricsSource
    if prometheus_url:
        source = PrometheusSource(prometheus_url)
    else:
        source = AgentScraper(
            lambda: scrape_targets((p.type, p.ip, p.status_port) for p in inputs.proxies())
        )
    remote = None
    if kubernetes:
        find = kube_replicas(
            inputs.kube_client,
            own_namespace(True, os.environ),
            DEFAULT_SELECTOR,
            inputs.xds_port,
        )
        remote = ReplicaRows(find, replica_id)
    dashboard = Dashboard(
        source,
        syncz=inputs.syncz,
        config=inputs.config,
        index=inputs.index,
        remote_rows=remote,
        statuses=_gateway_statuses,
    )
    return UiRoutes(dashboard)


def _gateway_statuses(config: MeshConfig) -> list[dict[str, Any]]:
    return [
        {**gateway_status.as_json(s), "group": GATEWAY_API_GROUP} for s in config.gateway_api_status
    ]
