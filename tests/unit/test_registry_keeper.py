"""The auto-registered workloads' lifecycle (control/registry/keeper.py) and their way into a
push (control/pipeline.py): real files, a real event loop, a fake clock only for the grace."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path
from typing import Any

from control.ca.identity import Identity
from control.config.watcher import ConfigWatcher
from control.metrics import Metrics
from control.model.proxy import Proxy, proxy_from_node
from control.model.types import MeshConfig, SourceRef
from control.model.workloadgroup import WorkloadGroup
from control.pipeline import CurrentPush, PushPipeline
from control.registry.autoregister import WorkloadRegistry
from control.registry.keeper import REGISTRY_FILE, WorkloadKeeper
from control.xds.cache import ResourceCache

WEB = Identity("shop", "web")
GROUP = WorkloadGroup(
    "shop", "web", SourceRef("WorkloadGroup", "shop", "web"), (("app", "web"),), (), "web"
)
CONFIG = MeshConfig(workload_groups=(GROUP,))
GROUP_YAML = (
    "apiVersion: networking.istio.io/v1\nkind: WorkloadGroup\n"
    "metadata: {name: web, namespace: shop}\n"
    "spec: {metadata: {labels: {app: web}}, template: {serviceAccount: web}}\n"
)


def proxy(ip: str = "10.0.0.1", pod: str = "web-1", ns: str = "shop") -> Proxy:
    metadata: dict[str, Any] = {"LABELS": {"app": "web"}, "WORKLOAD_GROUP": "web"}
    return proxy_from_node(f"sidecar~{ip}~{pod}.{ns}~{ns}.svc.cluster.local", metadata)


def registry(grace: float = 10.0) -> WorkloadRegistry:
    reg = WorkloadRegistry(grace=grace)
    reg.set_groups([GROUP])
    return reg


async def eventually(check: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


async def test_a_connected_proxy_is_saved_privately_and_restored(tmp_path: Path) -> None:
    changes: list[None] = []
    async with WorkloadKeeper(registry(), state_dir=str(tmp_path)) as keeper:
        keeper.subscribe(lambda: changes.append(None))
        keeper.proxy_connected(proxy(), WEB)
        assert len(changes) == 1
        path = tmp_path / REGISTRY_FILE
        await eventually(path.exists)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert [e["address"] for e in json.loads(path.read_text())] == ["10.0.0.1"]

    restored = WorkloadRegistry()
    async with WorkloadKeeper(restored, state_dir=str(tmp_path)) as again:
        # Decided again against the groups of the config being built.
        assert [w.address for w in again.workloads(CONFIG)] == ["10.0.0.1"]


async def test_a_workload_leaves_after_the_grace_and_subscribers_are_told() -> None:
    now = [100.0]
    changes: list[None] = []
    async with WorkloadKeeper(registry(grace=0.05), clock=lambda: now[0]) as keeper:
        keeper.subscribe(lambda: changes.append(None))
        p = proxy()
        keeper.proxy_connected(p, WEB)
        keeper.proxy_disconnected(p, WEB)
        assert keeper.workloads(CONFIG)  # still within the grace
        await asyncio.sleep(0.1)
        assert keeper.workloads(CONFIG)  # the grace is on the keeper's clock, which has not moved
        now[0] += 1.0
        await eventually(lambda: not keeper.workloads(CONFIG))
        assert len(changes) == 2  # joined, then left


async def test_proxies_do_not_register_when_registration_is_off() -> None:
    async with WorkloadKeeper(registry(), register=False) as keeper:
        keeper.proxy_connected(proxy(), WEB)
        assert keeper.workloads(CONFIG) == ()


async def test_a_deleted_group_takes_its_workloads_with_the_next_snapshot() -> None:
    async with WorkloadKeeper(registry()) as keeper:
        keeper.proxy_connected(proxy(), WEB)
        assert keeper.workloads(CONFIG)
        assert keeper.workloads(MeshConfig()) == ()


class Streams:
    """A PushTarget that only counts."""

    def __init__(self) -> None:
        self.pushes: list[frozenset[str] | None] = []

    def push_all(self, types: frozenset[str] | None = None) -> int:
        self.pushes.append(types)
        return 3


async def test_the_pipeline_pushes_what_the_source_and_the_keeper_hand_it(tmp_path: Path) -> None:
    (tmp_path / "svc.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\n"
        "spec: {selector: {app: web}, ports: [{name: http, port: 80}]}\n---\n" + GROUP_YAML
    )
    metrics = Metrics()
    source = ConfigWatcher([str(tmp_path)], debounce=0.01, poll_interval=0.01)
    keeper = WorkloadKeeper(WorkloadRegistry())
    current = CurrentPush(
        ResourceCache(), metrics, trust_domain="cluster.local", outbound_traffic_policy="ALLOW_ANY"
    )
    streams = Streams()
    pipeline = PushPipeline(source, keeper, current, streams, metrics, quiet=0.01, max_delay=1)
    async with source, keeper, pipeline:
        assert "web.shop.svc.cluster.local" in current.index.service_by_host
        keeper.proxy_connected(proxy(), WEB)
        await eventually(lambda: pipeline.pushes == 1)
        (record,) = pipeline.push_log
        assert record.reasons == ("registry",) and record.streams == 3
        assert record.config_snapshot == source.snapshot_at
        web = current.index.service_by_host["web.shop.svc.cluster.local"]
        assert [w.address for w in current.index.workloads_selected_by(web)] == ["10.0.0.1"]
