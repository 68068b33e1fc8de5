"""The istio-ca-root-cert ConfigMap, published by real control planes against the in-test API
server (tests/support/kubeapi.py): every namespace gets it, a new one within 2 s, tampering is
reverted, deletion undone, excluded namespaces get none, and two replicas converge (each
namespace created once, each repair written once)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from control.app import ControlPlane, ControlPlaneOptions
from control.ca.authority import in_memory_authority
from control.kube.client import KubeClient, from_kubeconfig
from control.kube.retry import ConflictRetry
from control.kube.rootcert import (
    CONFIG_LABEL,
    CONFIGMAP_NAME,
    DATA_KEY,
    Outcome,
    RootCertPublisher,
    new_configmap,
)
from tests.support.controlplane import eventually
from tests.support.kubeapi import FakeKubeApi

logger = logging.getLogger(__name__)

# The bound for a new namespace; also used for repairs (watch-driven, not resync).
WITHIN = 2.0


def namespace(name: str) -> dict[str, Any]:
    return {"kind": "Namespace", "metadata": {"name": name}, "status": {"phase": "Active"}}


def published(api: FakeKubeApi, ns: str, root: str) -> bool:
    cm = api.objects["configmaps"].get((ns, CONFIGMAP_NAME))
    return (
        cm is not None
        and (cm.get("data") or {}).get(DATA_KEY) == root
        and cm["metadata"].get("labels", {}).get(CONFIG_LABEL) == "true"
    )


def options(kubeconfig: Path, **kw: Any) -> ControlPlaneOptions:
    return ControlPlaneOptions(
        kubernetes=True,
        kubeconfig=str(kubeconfig),
        xds_address="127.0.0.1:0",
        http_address="127.0.0.1:0",
        **kw,
    )


async def timed(check: Any, what: str) -> float:
    start = time.monotonic()
    await eventually(check, timeout=WITHIN, interval=0.01, what=what)
    return time.monotonic() - start


async def test_every_namespace_kept_published(tmp_path: Path) -> None:
    async with FakeKubeApi() as api:
        for name in ("default", "istio-system", "shop", "kube-system", "kube-public", "skipme"):
            api.put(namespace(name))
        tampered = new_configmap("shop", "someone else's root")
        tampered["kind"] = "ConfigMap"
        tampered["data"]["other.pem"] = "kept"
        api.put(tampered)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig())
        excluded = frozenset(("kube-system", "kube-public", "skipme"))
        async with ControlPlane(options(kubeconfig, root_cert_excluded_namespaces=excluded)) as cp:
            assert cp.ca is not None and cp.root_cert_publisher is not None
            root = cp.ca.root_pem

            def all_published() -> bool:
                return all(published(api, ns, root) for ns in ("default", "istio-system", "shop"))

            await eventually(all_published, what="existing namespaces published")
            # The drift found at start is repaired in place: other keys kept.
            assert api.objects["configmaps"][("shop", CONFIGMAP_NAME)]["data"]["other.pem"] == (
                "kept"
            )

            api.put(namespace("late"))
            new_ns = await timed(lambda: published(api, "late", root), "new namespace")

            cm = json.loads(json.dumps(api.objects["configmaps"][("default", CONFIGMAP_NAME)]))
            cm["kind"] = "ConfigMap"
            cm["data"][DATA_KEY] = "tampered"
            api.put(cm)
            repaired = await timed(lambda: published(api, "default", root), "tampering repaired")

            api.delete("ConfigMap", "istio-system", CONFIGMAP_NAME)
            recreated = await timed(lambda: published(api, "istio-system", root), "recreated")

            # Watches expired (etcd compaction, 410): both are listed again and kept working.
            relists = api.requests.count("LIST configmaps")
            api.expire_watches()
            api.delete("ConfigMap", "shop", CONFIGMAP_NAME)
            await eventually(lambda: published(api, "shop", root), what="recreated after 410")
            assert api.requests.count("LIST configmaps") > relists

            # Excluded namespaces: none, after everything above was seen and handled.
            for ns in excluded:
                assert (ns, CONFIGMAP_NAME) not in api.objects["configmaps"], ns
            # What the watches show catches up with the writes (a write's own watch event
            # arrives a moment after the object is visible in the API server).
            publisher = cp.root_cert_publisher
            await eventually(lambda: publisher.pending() == [], what="nothing left to publish")
            logger.warning(
                "root cert: new namespace %.3fs, tamper repaired %.3fs, deletion undone %.3fs",
                new_ns,
                repaired,
                recreated,
            )
            print(f"FIGURES new={new_ns:.3f}s repaired={repaired:.3f}s recreated={recreated:.3f}s")


async def test_two_replicas_converge(tmp_path: Path) -> None:
    """Two replicas sharing a root (one state dir) against one API server: every namespace is
    created exactly once, a tampered ConfigMap is written back exactly once, and the loser of
    each race stops after one conflict."""
    names = [f"ns{i}" for i in range(8)]
    async with FakeKubeApi() as api:
        for name in names:
            api.put(namespace(name))
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig())
        state = str(tmp_path / "state")
        replicas = [ControlPlane(options(kubeconfig, state_dir=state, id=n)) for n in "ab"]
        try:
            for cp in replicas:
                await cp.start()
            assert replicas[0].ca is not None and replicas[1].ca is not None
            root = replicas[0].ca.root_pem
            assert replicas[1].ca.root_pem == root
            publishers = [cp.root_cert_publisher for cp in replicas]
            assert publishers[0] is not None and publishers[1] is not None

            def converged() -> bool:
                return all(published(api, ns, root) for ns in names) and all(
                    p is not None and p.configmaps.synced and not p.pending() for p in publishers
                )

            # No ConfigMap exists at start: the publisher must act on the namespaces list
            # even though listing the ConfigMaps changed nothing.
            await eventually(converged, what="both replicas see every namespace published")
            assert api.creates == len(names)  # one create per namespace, never two
            assert api.already_exists <= len(names)  # at most one loser per namespace

            # Tamper with all of them at once: both replicas race to repair each.
            for ns in names:
                cm = json.loads(json.dumps(api.objects["configmaps"][(ns, CONFIGMAP_NAME)]))
                cm["kind"] = "ConfigMap"
                cm["data"][DATA_KEY] = "tampered"
                api.put(cm)
            await eventually(converged, what="tampering repaired, both replicas agree")
            assert api.updates == len(names)  # each repaired once: the other PUT got 409
            assert api.conflicts <= len(names)

            # A last namespace, observed by both: by then any write loop would have shown.
            api.put(namespace("last"))
            names.append("last")
            await eventually(converged, timeout=WITHIN, what="the last namespace")
            assert api.creates == len(names)
            assert api.updates == len(names) - 1
        finally:
            for cp in replicas:
                await cp.close(0.5)


async def client_for(api: FakeKubeApi, tmp_path: Path) -> KubeClient:
    path = tmp_path / "kubeconfig"
    path.write_text(api.kubeconfig())
    return KubeClient(from_kubeconfig(str(path)))


def publisher(client: KubeClient, root: str) -> RootCertPublisher:
    p = RootCertPublisher(client, root, retry=ConflictRetry(fast_delay=0.01, slow_delay=0.1))
    p.namespaces.listed([], "1")
    return p


async def test_stale_cache_recoveries(tmp_path: Path) -> None:
    """`sync` from a cache behind the API server: each refusal leads to the right next step,
    and an object already right is not written again."""
    root = in_memory_authority("cluster.local").root_pem
    async with FakeKubeApi() as api:
        for ns in ("gone", "won", "exists"):
            api.put(namespace(ns))
        async with await client_for(api, tmp_path) as client:
            p = publisher(client, root)
            stale = {}
            for ns in ("gone", "won"):
                cm = new_configmap(ns, "old")
                cm["kind"] = "ConfigMap"
                stale[ns] = api.put(cm)
            # "gone": deleted after we cached it; the PUT's 404 turns into a create.
            api.delete("ConfigMap", "gone", CONFIGMAP_NAME)
            # "won": another replica already wrote our root; our PUT is stale (409).
            fixed = json.loads(json.dumps(stale["won"]))
            fixed["data"][DATA_KEY] = root
            api.put(fixed)
            # "exists": another replica created it; our cache has nothing (POST 409).
            created = new_configmap("exists", root)
            created["kind"] = "ConfigMap"
            api.put(created)
            p.configmaps.listed(stale.values(), str(api.rv))
            writes = (api.creates, api.updates)

            assert await p.sync("gone") is Outcome.CREATED
            assert await p.sync("won") is Outcome.UP_TO_DATE
            assert await p.sync("exists") is Outcome.UP_TO_DATE
            assert (api.creates, api.updates) == (writes[0] + 1, writes[1])
            assert api.conflicts == 1 and api.already_exists == 1
            assert all(published(api, ns, root) for ns in ("gone", "won", "exists"))
            # What was read back is remembered: nothing due, no second round of conflicts.
            p.namespaces.listed([namespace(n) for n in ("gone", "won", "exists")], str(api.rv))
            assert p.pending() == []


async def test_missing_namespace_is_given_up(tmp_path: Path) -> None:
    root = in_memory_authority("cluster.local").root_pem
    async with FakeKubeApi() as api, await client_for(api, tmp_path) as client:
        p = publisher(client, root)
        p.configmaps.listed([], "1")
        assert await p.sync("nowhere") is Outcome.FAILED
        assert [r for r in api.requests if CONFIGMAP_NAME in r] == [
            f"POST configmaps {CONFIGMAP_NAME}"
        ]
