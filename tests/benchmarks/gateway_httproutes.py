"""Benchmark (information, beside gateway_config.py): the same shape of config as real
Gateway API objects, N HTTPRoutes (one file each, as the watcher keeps an unchanged file's
objects) to N Services through one Gateway with an HTTP and an HTTPS listener.

Unlike the VirtualServices of gateway_config.py, every route comes out of the Gateway API
translation (control/gatewayapi) as a new object on every change, since the translation works
from the whole config: the index takes the previous objects over for the equal ones
(model/vs_carry.py), which costs comparing each of them. Printed: the full generation, the
translation after one route's file changed (config/merge.py, not part of either generation
figure) and the generation after it, medians over runs.
"""

from __future__ import annotations

import statistics
import time

from control.config.loader import load_text
from control.config.merge import merge
from control.config.objects import FileConfig
from control.generate.context import GenContext, next_context
from control.model.gatewayapi import GATEWAY_NAME_LABEL
from control.model.index import MeshIndex
from control.model.proxy import Proxy, proxy_from_node
from control.model.types import MeshConfig
from control.xds.cache import ResourceCache
from tests.benchmarks.gateway_config import _generate
from tests.support.gatewayapi import backend, dump, gateway, gateway_class, listener, route, service

CERT = ("infra", "cert")


def _route(i: int, n: int, prefix: str) -> FileConfig:
    rules = [
        {
            "matches": [{"path": {"type": "PathPrefix", "value": prefix}}],
            "backendRefs": [backend(f"s{i}", weight=90), backend(f"s{(i + 1) % n}", weight=10)],
        },
        {"backendRefs": [backend(f"s{i}")]},
    ]
    text = dump(route(f"r{i}", hostnames=[f"h{i}.example.com"], rules=rules))
    return load_text(text, f"r{i}.yaml")


def _files(n: int) -> dict[str, FileConfig]:
    listeners = [
        listener("http", 8080, from_="All"),
        listener(
            "https",
            8443,
            "HTTPS",
            from_="All",
            tls={"mode": "Terminate", "certificateRefs": [{"name": CERT[1]}]},
        ),
    ]
    base = dump(
        gateway_class(), *(service(f"s{i}") for i in range(n)), gateway(listeners=listeners)
    )
    files = {"base.yaml": load_text(base, "base.yaml")}
    files.update((f"r{i}.yaml", _route(i, n, "/api")) for i in range(n))
    return files


def _merged(files: dict[str, FileConfig]) -> MeshConfig:
    return merge(list(files.values()), secrets={CERT})


def _router() -> Proxy:
    return proxy_from_node(
        "router~10.255.0.9~gw-0.infra~infra.svc.cluster.local",
        {"LABELS": {GATEWAY_NAME_LABEL: "gw"}, "SDS": "true"},
    )


def run(routes: int, runs: int) -> dict[str, float]:
    files = _files(routes)
    proxy = _router()
    config = _merged(files)
    fulls = []
    for _ in range(runs):
        start = time.perf_counter()
        ctx = GenContext(MeshIndex(config), ResourceCache())
        count = _generate(ctx, proxy)
        fulls.append(time.perf_counter() - start)
    merges, pushes = [], []
    position = routes // 2
    for k in range(runs):
        files[f"r{position}.yaml"] = _route(position, routes, f"/v{k + 2}")
        start = time.perf_counter()
        config = _merged(files)
        merges.append(time.perf_counter() - start)
        start = time.perf_counter()
        ctx = next_context(ctx, ctx.index.next(config, version=k + 1))
        _generate(ctx, proxy)
        pushes.append(time.perf_counter() - start)
    full_s, merge_s, push_s = (statistics.median(x) for x in (fulls, merges, pushes))
    print(
        f"gateway config (information) through the Gateway API translation: {routes}"
        f" HTTPRoutes, one router: full {full_s * 1000:.1f} ms ({count} resources); one"
        f" HTTPRoute edited: translation {merge_s * 1000:.1f} ms (not in the figures), then"
        f" {push_s * 1000:.1f} ms, 1/{full_s / push_s:.0f} of full"
        f"  (runs: {', '.join(f'{t * 1000:.1f}' for t in pushes)})"
    )
    return {
        "httproutes_full_ms": full_s * 1000,
        "httproutes_translation_ms": merge_s * 1000,
        "httproutes_incremental_ms": push_s * 1000,
    }
