"""The Kubernetes config source against the in-test API server (tests/support/kubeapi.py):
initial sync before readiness, watch events, bookmarks and resume, 410 Gone → relist with
nothing lost, paging, a CRD that is not installed, a bad object keeping its last good version;
then the whole path to a real Envoy through an agent: a Pod added/removed changes Envoy's
endpoints, a Service change arrives within a couple of seconds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from control.app import ControlPlane, ControlPlaneOptions
from control.ctl import configdump
from control.kube.client import from_kubeconfig
from control.kube.source import KubeSource
from control.model.types import MeshConfig
from control.xds.server import XdsOptions
from tests.support.apps import EchoApp
from tests.support.controlplane import agent_token, bounded_teardown, eventually
from tests.support.kubeapi import FakeKubeApi, node, pod
from tests.support.mesh import mesh_agent
from tests.support.net import pod_ip


def service(name: str, selector: dict[str, str], target_port: int = 8080) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "selector": selector,
            "clusterIP": "10.96.0.10",
            "clusterIPs": ["10.96.0.10"],
            "type": "ClusterIP",
            "sessionAffinity": "None",
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "internalTrafficPolicy": "Cluster",
            "ports": [{"name": "http", "port": 9080, "targetPort": target_port, "protocol": "TCP"}],
        },
    }


def addresses(config: MeshConfig) -> set[str]:
    return {w.address for w in config.workload_entries}


async def kube_source(api: FakeKubeApi, tmp_path: Path, changes: list[MeshConfig]) -> KubeSource:
    path = tmp_path / "kubeconfig"
    path.write_text(api.kubeconfig())
    return KubeSource(from_kubeconfig(str(path)), changes.append, debounce=0.02)


async def test_list_watch_relist_and_readiness(tmp_path: Path) -> None:
    async with FakeKubeApi(bookmark_interval=0.1) as api:
        api.unserved.add("serviceentries")  # that CRD is not installed: empty, still ready
        api.put(service("web", {"app": "web"}))
        for i in range(5):  # more than one page (page size 2 below)
            api.put(pod(f"web-{i}", f"10.0.0.{i + 1}", {"app": "web"}))
        api.put(pod("not-ready", "10.0.1.1", {"app": "web"}, ready=False))
        changes: list[MeshConfig] = []
        source = await kube_source(api, tmp_path, changes)
        source.page_size = 2
        async with source:
            # start() returned: everything was listed (readiness waits for this).
            assert all(r.synced for r in source.reflectors.values())
            assert addresses(source.current) == {f"10.0.0.{i}" for i in range(1, 6)}
            assert [s.hostname for s in source.current.services] == [
                "web.default.svc.cluster.local"
            ]
            assert api.requests.count("LIST pods") >= 3  # paged

            # A watch event: a new pod.
            api.put(pod("web-new", "10.0.0.9", {"app": "web"}))
            await eventually(lambda: "10.0.0.9" in addresses(source.current), what="added")
            # Bookmarks move the resume point without changing anything.
            await eventually(lambda: source.reflectors["Pod"].bookmarks > 0, what="bookmark")

            # 410 Gone: the watch ends, and while no watch is open a pod is deleted and
            # another added; the relist replaces the store, so neither change is lost.
            lists_before = api.requests.count("LIST pods")
            api.expire_watches()
            api.delete("Pod", "default", "web-0")
            api.put(pod("web-late", "10.0.0.10", {"app": "web"}))
            await eventually(
                lambda: (
                    "10.0.0.10" in addresses(source.current)
                    and "10.0.0.1" not in addresses(source.current)
                ),
                what="relisted",
            )
            assert api.requests.count("LIST pods") > lists_before
            assert source.reflectors["Pod"].relists >= 1

            # A watch that the server ends (timeout) resumes from the last resourceVersion.
            rv = source.reflectors["Pod"].resource_version
            assert any(r.startswith("WATCH pods rv=") for r in api.requests)

            # A bad object: reported, the last good version stays.
            bad = service("web", {"app": "web"})
            bad["spec"]["ports"][0]["port"] = 99999
            api.put(bad)
            await eventually(lambda: source.errors, what="error recorded")
            (name, err), *_ = source.errors.items()
            assert name == "Service default/web" and "ports[0].port" in str(err), err
            assert [s.hostname for s in source.current.services] == [
                "web.default.svc.cluster.local"
            ]
            api.put(service("web", {"app": "web"}, target_port=8081))
            await eventually(lambda: not source.errors, what="error cleared")
            port = source.current.services[0].ports[0]
            assert port.target_port == 8081
            assert int(rv) > 0 and changes


async def test_watch_resumes_from_resource_version_after_server_timeout(tmp_path: Path) -> None:
    async with FakeKubeApi() as api:
        api.put(pod("a", "10.0.0.1", {"app": "a"}))
        changes: list[MeshConfig] = []
        source = await kube_source(api, tmp_path, changes)
        source.watch_timeout = 1  # the server ends each watch after a second
        async with source:
            rv = source.reflectors["Pod"].resource_version
            await eventually(
                lambda: api.requests.count(f"WATCH pods rv={rv}") >= 2, timeout=10, what="resume"
            )
            assert api.requests.count("LIST pods") == 1  # resumed, never relisted
            api.put(pod("b", "10.0.0.2", {"app": "a"}))
            await eventually(lambda: "10.0.0.2" in addresses(source.current), what="event")


@pytest.mark.envoy
async def test_pods_and_services_reach_envoy_through_an_agent(tmp_path: Path) -> None:
    client_ip, backend_ip, backend2_ip = pod_ip(), pod_ip(), pod_ip()
    apps = [EchoApp("backend", backend_ip, 8080), EchoApp("backend-2", backend2_ip, 8080)]
    for a in apps:
        await a.start()
    async with FakeKubeApi() as api:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig())
        api.put(service("backend", {"app": "backend"}))
        api.put(pod("client", client_ip, {"app": "client"}))
        cp = ControlPlane(
            ControlPlaneOptions(
                kubernetes=True,
                kubeconfig=str(kubeconfig),
                xds_address="127.0.0.1:0",
                secure_xds_address="127.0.0.1:0",
                http_address="127.0.0.1:0",
                id="kube-cp",
                debounce_quiet=0.05,
                debounce_max=1.0,
                xds=XdsOptions(control_plane_id="kube-cp"),
            )
        )
        await cp.start()
        # The TLS port: the agent's certificate is signed only there.
        client = mesh_agent(cp, tmp_path, client_ip, "client", "app=client", workdir=tmp_path / "c")
        client.start()
        admin = f"http://{client_ip}:15000/config_dump?include_eds"

        async def endpoints() -> set[str]:
            try:
                dump = await configdump.fetch_json(admin)
            except configdump.DumpError:
                return set()
            rows = configdump.table("endpoints", configdump.envoy_resources(dump, "endpoints"))[1]
            return {r[0] for r in rows if r[3].endswith("|backend.default.svc.cluster.local")}

        async def get() -> tuple[int, str]:
            try:
                async with (
                    aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s,
                    s.get(f"http://{client_ip}:9080/", headers={"Host": "backend"}) as r,
                ):
                    return r.status, await r.text()
            except (aiohttp.ClientError, TimeoutError):
                return 0, ""

        try:
            await eventually(
                lambda: _ready(f"http://{client_ip}:15020/healthz/ready"),
                timeout=30,
                what="agent ready",
            )
            assert await endpoints() == set()
            # The client pod is not a workload of the backend service; no auto-registration.
            assert addresses(cp.watcher.current) == {client_ip}

            api.put(pod("backend-1", backend_ip, {"app": "backend"}))
            await eventually(
                lambda: _eq(endpoints(), {f"{backend_ip}:8080"}), timeout=10, what="pod added"
            )
            status, body = await eventually(lambda: _ok(get()), timeout=10, what="traffic")
            assert json.loads(body)["app"] == "backend"

            # 410 while a second pod appears: relisted, nothing lost.
            api.expire_watches()
            api.put(pod("backend-2", backend2_ip, {"app": "backend"}))
            await eventually(
                lambda: _eq(endpoints(), {f"{backend_ip}:8080", f"{backend2_ip}:8080"}),
                timeout=10,
                what="second pod after relist",
            )
            assert isinstance(cp.watcher, KubeSource)
            assert cp.watcher.reflectors["Pod"].relists >= 1

            api.delete("Pod", "default", "backend-1")
            await eventually(
                lambda: _eq(endpoints(), {f"{backend2_ip}:8080"}), timeout=10, what="removed"
            )

            # A Service change (targetPort) reaches Envoy within a couple of seconds.
            apps.append(EchoApp("backend-2b", backend2_ip, 8081))
            await apps[-1].start()
            api.put(service("backend", {"app": "backend"}, target_port=8081))
            await eventually(
                lambda: _eq(endpoints(), {f"{backend2_ip}:8081"}), timeout=3, what="svc change"
            )
            status, body = await eventually(lambda: _ok(get()), timeout=5, what="new port")
            assert json.loads(body)["app"] == "backend-2b"
        finally:
            client.kill()
            await bounded_teardown(cp.close(0.2), "control plane close")
    for a in apps:
        await a.close()


async def _ready(url: str) -> bool:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s,
            s.get(url) as r,
        ):
            return bool(r.status == 200)
    except (aiohttp.ClientError, TimeoutError):
        return False


async def _eq(call: Any, want: set[str]) -> bool:
    return bool(await call == want)


async def _ok(call: Any) -> tuple[int, str] | None:
    status, body = await call
    return (status, body) if status == 200 else None


async def test_token_review_gives_the_callers_identity(tmp_path: Path) -> None:
    """Kubernetes mode: a service-account token the control plane did not sign is checked
    with TokenReview (audience istio-ca) on CreateCertificate and on the TLS xDS port."""
    import grpc
    from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest, DiscoveryResponse

    from protos.ads import SOTW_METHOD
    from tests.integration.test_ca_service import create
    from tests.support.kubeapi import TokenInfo
    from tests.support.pki import make_csr, spiffe_ids

    async with FakeKubeApi() as api:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig())
        sa_token = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"  # opaque to us: RS256
        api.tokens[sa_token] = TokenInfo("shop", "cart")
        api.tokens["wrong-audience"] = TokenInfo("shop", "cart", audiences=("other",))
        cp = ControlPlane(
            ControlPlaneOptions(
                kubernetes=True,
                kubeconfig=str(kubeconfig),
                xds_address="127.0.0.1:0",
                secure_xds_address="127.0.0.1:0",
                http_address="127.0.0.1:0",
            )
        )
        await cp.start()
        try:
            assert cp.ca is not None
            creds = grpc.ssl_channel_credentials(root_certificates=cp.ca.root_pem.encode())
            async with grpc.aio.secure_channel(f"127.0.0.1:{cp.secure_xds_port}", creds) as ch:
                chain = await create(ch, make_csr(), sa_token)
                assert spiffe_ids(chain[0]) == ["spiffe://cluster.local/ns/shop/sa/cart"]
                # Cached: a second call does not ask again.
                await create(ch, make_csr(), sa_token)
                assert api.requests.count("TOKENREVIEW") == 1
                for bad in ("unknown-token", "wrong-audience"):
                    try:
                        await create(ch, make_csr(), bad)
                        raise AssertionError(f"{bad} accepted")
                    except grpc.aio.AioRpcError as e:
                        assert e.code() is grpc.StatusCode.UNAUTHENTICATED
                        assert "token review" in (e.details() or ""), e.details()
                # Our own tokens still work (pilotfish-ctl token).
                chain = await create(ch, make_csr(), agent_token(cp, "default", "sleep"))
                assert spiffe_ids(chain[0]) == ["spiffe://cluster.local/ns/default/sa/sleep"]

                # An xDS stream on the TLS port: the reviewed identity must match the node.
                async def first_answer(namespace: str) -> int:
                    call = ch.stream_stream(
                        SOTW_METHOD,
                        request_serializer=DiscoveryRequest.SerializeToString,
                        response_deserializer=DiscoveryResponse.FromString,
                    )(metadata=[("authorization", f"Bearer {sa_token}")])
                    r = DiscoveryRequest(
                        type_url="type.googleapis.com/envoy.config.cluster.v3.Cluster"
                    )
                    r.node.id = f"sidecar~10.0.0.1~cart-1.{namespace}~{namespace}.svc.cluster.local"
                    r.node.metadata.update({"SERVICE_ACCOUNT": "cart", "NAMESPACE": namespace})
                    try:
                        await call.write(r)
                        await call.read()
                        return 0
                    except grpc.aio.AioRpcError as e:
                        return int(e.code().value[0])
                    finally:
                        call.cancel()

                assert await first_answer("shop") == 0
                assert await first_answer("default") == grpc.StatusCode.PERMISSION_DENIED.value[0]
        finally:
            await bounded_teardown(cp.close(0.2), "control plane close")


async def test_a_pod_locality_comes_from_its_node(tmp_path: Path) -> None:
    zone_a = {"topology.kubernetes.io/region": "us-east", "topology.kubernetes.io/zone": "a"}
    async with FakeKubeApi() as api:
        api.put(service("web", {"app": "web"}))
        api.put(node("node-1", {**zone_a, "kubernetes.io/hostname": "node-1"}))
        api.put(pod("web-1", "10.0.0.1", {"app": "web"}, node="node-1"))
        # A pod's own `istio-locality` label wins over its node's.
        api.put(pod("web-2", "10.0.0.2", {"app": "web", "istio-locality": "eu.b.c"}))
        api.put(pod("web-3", "10.0.0.3", {"app": "web"}, node="unknown-node"))
        changes: list[MeshConfig] = []
        source = await kube_source(api, tmp_path, changes)
        async with source:

            def localities() -> dict[str, str]:
                return {w.address: w.locality for w in source.current.workload_entries}

            assert localities() == {
                "10.0.0.1": "us-east/a",
                "10.0.0.2": "eu/b/c",
                "10.0.0.3": "",
            }
            # Only the topology labels are kept of a Node: a heartbeat is no change.
            (kept,) = source.reflectors["Node"].store.values()
            assert kept == {"metadata": {"name": "node-1", "labels": zone_a}}
            reloads = source.reloads
            api.put(node("node-1", {**zone_a, "kubernetes.io/hostname": "node-1"}, "12:00"))
            # A relabelled node moves its pods.
            api.put(node("node-1", {**zone_a, "topology.istio.io/subzone": "rack7"}))
            await eventually(lambda: localities()["10.0.0.1"] == "us-east/a/rack7", what="moved")
            assert source.reloads == reloads + 1
