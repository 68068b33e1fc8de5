"""NDS generator (control/generate/names.py): which names a proxy's table holds (Sidecar
egress scoping), the addresses per interception mode, bytes shared per scope (rule 8), and
that an endpoint-only push still leaves a correct table."""

from __future__ import annotations

from pathlib import Path

from control.app import ControlPlane, ControlPlaneOptions
from control.generate import GENERATORS, GRPC_GENERATORS
from control.generate.context import GenContext
from control.model.index import MeshIndex
from control.model.proxy import Proxy, proxy_from_node
from control.model.types import (
    EgressListener,
    MeshConfig,
    Protocol,
    Service,
    ServicePort,
    SidecarScope,
    SourceRef,
    labels_of,
)
from control.xds.cache import ResourceCache
from protos import nds_pb2
from protos.typeurls import NAME_TABLE
from tests.support.controlplane import eventually

PORT = (ServicePort("http", 9080, Protocol.HTTP),)


def kube(name: str, ns: str, vip: str = "") -> Service:
    return Service(
        hostname=f"{name}.{ns}.svc.cluster.local",
        namespace=ns,
        name=name,
        ports=PORT,
        source=SourceRef("Service", ns, name),
        selector=labels_of({"app": name}),
        addresses=(vip,) if vip else (),
    )


def external(host: str, *addresses: str) -> Service:
    return Service(
        hostname=host,
        namespace="default",
        name="ext",
        ports=PORT,
        source=SourceRef("ServiceEntry", "default", "ext"),
        registry="External",
        addresses=addresses,
    )


SERVICES = (
    kube("backend", "default", "10.96.0.1"),
    kube("headless", "default"),
    kube("db", "shop", "10.96.0.2"),
    external("*.example.com", "240.0.0.1"),
    external("no-vip.example.org"),
    external("range.example.net", "10.10.0.0/16", "240.0.0.3"),
)

SHOP_ONLY = SidecarScope(
    namespace="scoped",
    name="default",
    source=SourceRef("Sidecar", "scoped", "default"),
    egress=(EgressListener(hosts=("shop/*",)),),
)


def proxy(ip: str, ns: str = "default", mode: str = "NONE", generator: str = "") -> Proxy:
    meta = {"INTERCEPTION_MODE": mode, "NAMESPACE": ns}
    if generator:
        meta["GENERATOR"] = generator
    return proxy_from_node(f"sidecar~{ip}~pod.{ns}~{ns}.svc.cluster.local", meta)


def table_of(ctx: GenContext, p: Proxy) -> nds_pb2.NameTable:
    rs = GENERATORS[NAME_TABLE](ctx, p)
    assert list(rs) == [""]  # one unnamed resource, as Istio sends it
    from google.protobuf import any_pb2

    nt = nds_pb2.NameTable()
    assert any_pb2.Any.FromString(rs[""].any_bytes).Unpack(nt)
    return nt


def context() -> GenContext:
    return GenContext(
        MeshIndex(MeshConfig(services=SERVICES, sidecars=(SHOP_ONLY,))), ResourceCache()
    )


def test_none_mode_answers_every_visible_name_with_the_pod_ip() -> None:
    nt = table_of(context(), proxy("127.0.1.5"))
    assert sorted(nt.table) == sorted(s.hostname for s in SERVICES)
    assert {h: list(i.ips) for h, i in nt.table.items()} == {
        s.hostname: ["127.0.1.5"] for s in SERVICES
    }
    backend = nt.table["backend.default.svc.cluster.local"]
    assert (backend.registry, backend.shortname, backend.namespace) == (
        "Kubernetes",
        "backend",
        "default",
    )
    wildcard = nt.table["*.example.com"]
    assert (wildcard.registry, wildcard.shortname, wildcard.namespace) == ("External", "", "")


def test_redirect_mode_answers_vips_and_leaves_vipless_names_upstream() -> None:
    nt = table_of(context(), proxy("127.0.1.5", mode="REDIRECT"))
    assert {h: list(i.ips) for h, i in nt.table.items()} == {
        "backend.default.svc.cluster.local": ["10.96.0.1"],
        "db.shop.svc.cluster.local": ["10.96.0.2"],
        "*.example.com": ["240.0.0.1"],
        "range.example.net": ["240.0.0.3"],  # a CIDR is not an address to answer with
    }


def test_sidecar_egress_scoping_limits_the_table() -> None:
    nt = table_of(context(), proxy("127.0.1.6", ns="scoped"))
    assert sorted(nt.table) == ["db.shop.svc.cluster.local"]


def test_proxyless_agents_get_the_same_table() -> None:
    ctx = context()
    assert GRPC_GENERATORS[NAME_TABLE] is GENERATORS[NAME_TABLE]
    assert table_of(ctx, proxy("127.0.1.7", generator="grpc")).table.keys() == (
        table_of(ctx, proxy("127.0.1.7")).table.keys()
    )


def test_bytes_are_shared_per_scope_and_address() -> None:
    ctx = context()
    a = GENERATORS[NAME_TABLE](ctx, proxy("127.0.1.8"))
    again = GENERATORS[NAME_TABLE](ctx, proxy("127.0.1.8"))
    other = GENERATORS[NAME_TABLE](ctx, proxy("127.0.1.9"))
    assert a[""] is again[""]
    assert a[""].version != other[""].version
    r1 = GENERATORS[NAME_TABLE](ctx, proxy("127.0.1.8", mode="REDIRECT"))
    r2 = GENERATORS[NAME_TABLE](ctx, proxy("127.0.1.9", mode="REDIRECT"))
    assert r1[""] is r2[""]  # VIPs do not depend on who asks
    before = ctx.cache.serializations
    fresh = GenContext(ctx.index, ctx.cache)  # the next push, same config
    assert GENERATORS[NAME_TABLE](fresh, proxy("127.0.1.8"))[""] is a[""]
    assert ctx.cache.serializations == before


async def test_service_change_repushes_names_and_endpoint_change_keeps_them(
    tmp_path: Path,
) -> None:
    """The EDS-only push optimisation must not skip NDS when services change."""
    mesh = tmp_path / "mesh.yaml"
    service = (
        "apiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: default}\n"
        "spec:\n  selector: {app: a}\n  ports: [{name: http, port: 9080}]\n"
    )
    mesh.write_text(service % "one")
    cp = ControlPlane(
        ControlPlaneOptions(
            config_paths=(str(mesh),),
            xds_address="127.0.0.1:0",
            http_address="127.0.0.1:0",
            # Pushes only when the test says so (push_now), never from the debounce loop.
            debounce_quiet=3600,
            debounce_max=3600,
            config_poll_interval=0.02,
            config_settle=0.01,
        )
    )
    await cp.start()
    try:
        p = proxy("127.0.1.10")
        first = cp.resources(p, [NAME_TABLE])[NAME_TABLE]
        reloads = cp.watcher.reloads
        mesh.write_text(service % "one" + "---\n" + service % "two")
        await eventually(lambda: cp.watcher.reloads > reloads, what="config reload")
        cp.push_now()
        second = cp.resources(p, [NAME_TABLE])[NAME_TABLE]
        assert second.digest != first.digest
        assert cp.metrics.eds_only_pushes._value.get() == 0
    finally:
        await cp.close(0)
