"""The control plane's /metrics: Istio's names, types, labels and buckets, each made to move by
real ADS streams, real config changes, a Kubernetes API (the fake that speaks its protocol)
and the injection webhook over HTTPS. Read as text over HTTP, by exact sample name."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest

from control.app import ControlPlane, ControlPlaneOptions
from control.webhook.values import MERGE_METRICS_ANNOTATION as MERGE
from protos import typeurls
from tests.support.admission import admission_review
from tests.support.adsclient import AdsStream, node_id
from tests.support.controlplane import bounded_teardown, eventually, running_control_plane
from tests.support.kubeapi import FakeKubeApi, pod
from tests.support.net import pod_ip
from tests.support.promtext import Exposition, parse

CDS, EDS, LDS, RDS = typeurls.CLUSTER, typeurls.ENDPOINT, typeurls.LISTENER, typeurls.ROUTE
ISTIO_PUSH_BUCKETS = ["0.01", "0.1", "1.0", "3.0", "5.0", "10.0", "20.0", "30.0", "+Inf"]
ISTIO_CONVERGENCE_BUCKETS = ["0.1", "0.5", "1.0", "3.0", "5.0", "10.0", "20.0", "30.0", "+Inf"]


def service(name: str, port: int = 9080, port_name: str = "http", vip: str = "") -> str:
    cluster_ip = f"  clusterIP: {vip}\n" if vip else ""
    return (
        "apiVersion: v1\nkind: Service\n"
        f"metadata: {{name: {name}, namespace: default}}\n"
        f"spec:\n{cluster_ip}  selector: {{app: {name}}}\n"
        f"  ports: [{{name: {port_name}, port: {port}, targetPort: 8080}}]\n---\n"
    )


VIRTUAL_SERVICE = """\
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: web, namespace: default}
spec:
  hosts: [web]
  http: [{route: [{destination: {host: web}}]}]
"""


def request(
    type_url: str,
    names: tuple[str, ...] = (),
    *,
    ip: str = "",
    metadata: dict[str, Any] | None = None,
    after: Any = None,
    nonce: str = "",
    error: str = "",
) -> DiscoveryRequest:
    r = DiscoveryRequest(type_url=type_url, resource_names=list(names))
    if after is not None:
        r.response_nonce, r.version_info = after.nonce, after.version_info
    if nonce:
        r.response_nonce = nonce
    if ip:
        r.node.id = node_id(ip)
        r.node.metadata.update(metadata or {})
    if error:
        r.error_detail.code = grpc.StatusCode.INVALID_ARGUMENT.value[0]
        r.error_detail.message = error
    return r


async def scrape(cp: ControlPlane) -> Exposition:
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{cp.http_port}/metrics") as r,
    ):
        assert r.status == 200
        return parse(await r.text())


async def scraped_until(cp: ControlPlane, check: Any, what: str) -> Exposition:
    got: list[Exposition] = []

    async def ok() -> bool:
        got[:] = [await scrape(cp)]
        return bool(check(got[0]))

    await eventually(ok, timeout=10, what=what)
    return got[0]


@pytest.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[tuple[ControlPlane, Path, grpc.aio.Channel]]:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "web.yaml").write_text(service("web") + VIRTUAL_SERVICE)
    async with running_control_plane(cfg) as cp:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}")
        yield cp, cfg, channel
        await bounded_teardown(channel.close(), "client channel close")


async def test_xds_metrics_follow_streams_pushes_acks_and_nacks(mesh) -> None:
    cp, cfg, channel = mesh
    ip = pod_ip()
    proxy = node_id(ip)
    before = await scrape(cp)
    # Istio's exposition: counters without `_total`, no `_created` series, Istio's buckets.
    assert before.types["pilot_xds_pushes"] == "counter"
    assert before.types["pilot_total_xds_rejects"] == "counter"
    assert before.types["pilot_xds"] == "gauge"
    assert before.types["pilot_proxy_convergence_time"] == "histogram"
    assert before.types["pilot_xds_push_time"] == "histogram"
    own = {n for n in before.names() if n.startswith(("pilot_", "citadel_"))}
    assert own and not {n for n in own if n.endswith(("_total", "_created"))}
    buckets = [ls["le"] for ls in before.series("pilot_proxy_convergence_time_bucket")]
    assert sorted(buckets, key=float) == ISTIO_CONVERGENCE_BUCKETS
    assert before.value("istio_build", component="pilot", tag="0.1.0") == 1
    assert "process_cpu_seconds_total" in before.names()  # standard names for those
    assert before.value("pilot_services") == 1
    assert before.value("pilot_virt_services") == 1

    s = AdsStream(channel)
    await s.send(request(CDS, ip=ip, metadata={"ISTIO_VERSION": "1.24.0"}))
    first = await s.recv()
    await s.send(request(CDS, after=first))
    cds_before = before.total("pilot_xds_pushes", type="cds")
    m = await scraped_until(
        cp,
        lambda m: (
            m.value("pilot_xds", version="1.24.0") == 1
            and m.total("pilot_xds_pushes", type="cds") == cds_before + 1
        ),
        "pilot_xds counts the stream, pilot_xds_pushes its response",
    )
    assert m.total("pilot_xds_push_time_count", type="cds") >= 1
    push_buckets = [
        ls["le"] for ls in m.series("pilot_xds_push_time_bucket") if ls["type"] == "cds"
    ]
    assert sorted(push_buckets, key=float) == ISTIO_PUSH_BUCKETS
    assert m.total("pilot_xds_send_time_count") > before.total("pilot_xds_send_time_count")
    assert m.total("pilot_xds_config_size_bytes_count", type="cds") >= 1
    assert m.total("pilot_xds_config_size_bytes_sum", type="cds") >= first.ByteSize() * 0.5

    # A config change: a push (trigger "config", after the debounce), the proxy ACKs it and
    # converges; the new service is counted.
    (cfg / "api.yaml").write_text(service("api"))
    pushed = await s.recv()
    await s.send(request(CDS, after=pushed))
    m = await scraped_until(
        cp,
        lambda m: (
            m.total("pilot_proxy_convergence_time_count")
            > before.total("pilot_proxy_convergence_time_count")
        ),
        "convergence observed on the ACK",
    )
    assert m.value("pilot_services") == 2
    assert m.total("pilot_push_triggers", type="config") > before.total(
        "pilot_push_triggers", type="config"
    )
    assert m.total("pilot_debounce_time_count") > before.total("pilot_debounce_time_count")
    for histogram in ("pilot_proxy_queue_time", "pilot_pushcontext_init_seconds"):
        assert m.total(f"{histogram}_count") > before.total(f"{histogram}_count"), histogram

    # The next push is rejected: counted by type, and per node with Go's code name.
    (cfg / "db.yaml").write_text(service("db"))
    rejected = await s.recv()
    await s.send(request(CDS, after=rejected, error="no such filter"))
    m = await scraped_until(
        cp,
        lambda m: m.value("pilot_total_xds_rejects", type="cds") == 1,
        "pilot_total_xds_rejects",
    )
    assert m.value("pilot_xds_cds_reject", node=proxy, err="InvalidArgument") == 1
    assert m.types["pilot_xds_cds_reject"] == "gauge"

    # A request answering a nonce that is not the last one sent: ignored and counted.
    await s.send(request(CDS, nonce=first.nonce))
    await scraped_until(
        cp,
        lambda m: m.value("pilot_xds_expired_nonce", type="cds") == 1,
        "pilot_xds_expired_nonce",
    )

    await s.close()
    m = await scraped_until(
        cp, lambda m: m.value("pilot_xds", version="1.24.0") == 0, "stream gone from pilot_xds"
    )
    # The proxy's reject series go with its last stream (bounded by connected proxies).
    assert m.series("pilot_xds_cds_reject") == []


async def test_a_failing_generator_counts_an_internal_error(mesh, monkeypatch) -> None:
    cp, _, channel = mesh
    real = cp.current.resources
    calls = [0]

    def fails_once(proxy: Any, types: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("generator bug")
        return real(proxy, types)

    monkeypatch.setattr(cp.current, "resources", fails_once)
    s = AdsStream(channel)
    await s.send(request(CDS, ip=pod_ip()))
    await scraped_until(
        cp,
        lambda m: m.value("pilot_total_xds_internal_errors") == 1,
        "pilot_total_xds_internal_errors",
    )
    await s.close()


def conflicted(m: Exposition) -> dict[str, float | None]:
    return {
        "inbound": m.value("pilot_conflict_inbound_listener"),
        "tcp_over_tcp": m.value("pilot_conflict_outbound_listener_tcp_over_current_tcp"),
        "tcp_over_http": m.value("pilot_conflict_outbound_listener_tcp_over_current_http"),
        "http_over_tcp": m.value("pilot_conflict_outbound_listener_http_over_current_tcp"),
        "duplicate_domain": m.value("pilot_vservice_dup_domain"),
    }


async def test_listener_conflicts_are_counted_per_push(mesh) -> None:
    cp, cfg, channel = mesh
    assert set(conflicted(await scrape(cp)).values()) == {0}
    # Port 5000: two TCP services (the second loses the port); 6000: HTTP takes the port
    # from a TCP service. In REDIRECT, two services select the capture pod's port 8080 with
    # different protocols. Port 9090: two services share a VIP, whose Host names only the
    # first keeps (the VIP, bare and with the port).
    conflicts = (
        service("tcp-a", 5000, "tcp")
        + service("tcp-b", 5000, "tcp")
        + service("http-c", 6000, "http", vip="10.96.0.30")
        + service("tcp-d", 6000, "tcp")
        + service("both", 8000, "http", vip="10.96.0.40")
        + service("dup-a", 9090, "http", vip="10.96.0.50")
        + service("dup-b", 9090, "http", vip="10.96.0.50")
        + textwrap.dedent(
            """\
            apiVersion: v1
            kind: Service
            metadata: {name: both-tcp, namespace: default}
            spec:
              clusterIP: 10.96.0.41
              selector: {app: both}
              ports: [{name: tcp, port: 8001, targetPort: 8080}]
            """
        )
    )
    (cfg / "conflicts.yaml").write_text(conflicts)
    await eventually(lambda: len(cp.index.services) == 9, what="conflicting config loaded")
    explicit = AdsStream(channel)
    await explicit.send(request(LDS, ip=pod_ip(), metadata={"LABELS": {"app": "client"}}))
    await explicit.recv()
    await explicit.send(request(RDS, ("9090",)))
    await explicit.recv()
    capture = AdsStream(channel)
    metadata = {"LABELS": {"app": "both"}, "INTERCEPTION_MODE": "REDIRECT"}
    await capture.send(request(LDS, ip=pod_ip(), metadata=metadata))
    await capture.recv()
    m = await scraped_until(
        cp, lambda m: conflicted(m)["inbound"] == 1, "the inbound conflict of the capture pod"
    )
    assert conflicted(m) == {
        "inbound": 1,  # port 8080 of the capture pod
        "tcp_over_tcp": 1,  # tcp-b on 5000
        "tcp_over_http": 1,  # tcp-d on 6000
        "http_over_tcp": 0,  # HTTP always takes a shared port
        "duplicate_domain": 2,  # dup-b's 10.96.0.50 and 10.96.0.50:9090
    }
    # The conflicts resolved: the next push generates without them.
    (cfg / "conflicts.yaml").write_text(service("tcp-a", 5000, "tcp"))
    await explicit.recv()
    await scraped_until(
        cp, lambda m: set(conflicted(m).values()) == {0}, "conflicts gone after the push"
    )
    await explicit.close()
    await capture.close()


async def test_kubernetes_events_and_injection_counters(tmp_path: Path) -> None:
    async with FakeKubeApi() as api:
        api.put(
            {
                "kind": "Namespace",
                "metadata": {"name": "shop", "labels": {"istio-injection": "enabled"}},
            }
        )
        api.put(pod("web-1", pod_ip(), {"app": "web"}))
        api.put(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 9080}]},
            }
        )
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig())
        cp = ControlPlane(
            ControlPlaneOptions(
                kubernetes=True,
                kubeconfig=str(kubeconfig),
                xds_address="127.0.0.1:0",
                secure_xds_address="",
                http_address="127.0.0.1:0",
                webhook_address="127.0.0.1:0",
            )
        )
        async with cp:
            m = await scrape(cp)
            # The initial list counts as adds, as informers report it.
            assert m.value("pilot_k8s_reg_events", type="Pods", event="add") == 1
            assert m.value("pilot_k8s_reg_events", type="Services", event="add") == 1
            assert m.value("pilot_k8s_reg_events", type="Namespaces", event="add") == 1
            api.put(pod("web-2", pod_ip(), {"app": "web"}))
            relabelled = pod("web-1", pod_ip(), {"app": "web", "version": "v2"})
            api.put(relabelled)
            api.delete("Pod", "default", "web-2")
            api.put(
                {
                    "apiVersion": "networking.istio.io/v1",
                    "kind": "VirtualService",
                    "metadata": {"name": "web", "namespace": "default"},
                    "spec": {
                        "hosts": ["web"],
                        "http": [{"route": [{"destination": {"host": "web"}}]}],
                    },
                }
            )
            m = await scraped_until(
                cp,
                lambda m: (
                    m.value("pilot_k8s_reg_events", type="Pods", event="delete") == 1
                    and m.value("pilot_k8s_cfg_events", type="VirtualService", event="add") == 1
                ),
                "watch events counted",
            )
            assert m.value("pilot_k8s_reg_events", type="Pods", event="add") == 2
            assert m.value("pilot_k8s_reg_events", type="Pods", event="update") == 1
            assert m.types["pilot_k8s_reg_events"] == "counter"

            web = {
                "metadata": {"name": "web", "labels": {"app": "web"}},
                "spec": {"containers": [{"name": "app", "image": "web"}]},
            }
            injected = await admission_review(cp, web, namespace="shop")
            skipped = await admission_review(cp, web, namespace="default")
            bad = {**web, "metadata": {**web["metadata"], "annotations": {MERGE: "maybe"}}}
            refused = await admission_review(cp, bad, namespace="shop")
            assert "patch" in injected and "patch" not in skipped and not refused["allowed"]
            m = await scrape(cp)
            assert m.value("sidecar_injection_requests_total") == 3
            assert m.value("sidecar_injection_success_total") == 1
            assert m.value("sidecar_injection_skip_total") == 1
            assert m.value("sidecar_injection_failure_total") == 1
