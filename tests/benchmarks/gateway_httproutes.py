"""Benchmark (the issue's figure, beside gateway_config.py): generating a router's config from
N real HTTPRoutes (one file each, parsed once, as the watcher keeps an unchanged file's
objects) to N Services through one Gateway with an HTTP and an HTTPS listener, the Gateway
API translation included, full against one route changed.

- full: merge() of every file with a new Translator (control/gatewayapi/translate.py: every
  route translated), a new index and a cold cache, CDS, EDS, LDS and RDS for one router;
- incremental: one HTTPRoute's file holds a new path (parsed before the clock starts, as the
  full figure's files are): merge() with the Translator that saw the previous config (only
  that route translated again, every other VirtualService the previous object), the next
  index (MeshIndex.next), the next generation context and all four types generated again
  over the warm cache. Each run's change is a new one.

Also printed, in the same runs: the translation's share of each, and the incremental figure
with a Translator made anew for every change (what every change cost before the translation
was done per route). Medians over runs in one process; the ratio is what to read (target
<= 1/20).
"""

from __future__ import annotations

import statistics
import time

from control.config.loader import load_text
from control.config.merge import merge
from control.config.objects import FileConfig
from control.gatewayapi.translate import Translator
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


def _merged(files: dict[str, FileConfig], translator: Translator | None) -> MeshConfig:
    return merge(list(files.values()), secrets={CERT}, translator=translator)


def _router() -> Proxy:
    return proxy_from_node(
        "router~10.255.0.9~gw-0.infra~infra.svc.cluster.local",
        {"LABELS": {GATEWAY_NAME_LABEL: "gw"}, "SDS": "true"},
    )


def _incremental(
    routes: int, runs: int, translator: Translator | None
) -> tuple[list[float], list[float]]:
    """Each run: one route's file changed, then merge() (with `translator`, or a new one when
    None), the next index and generation. Returns the translations' and the totals' times."""
    files = _files(routes)
    proxy = _router()
    ctx = GenContext(MeshIndex(_merged(files, translator)), ResourceCache())
    _generate(ctx, proxy)
    merges, totals = [], []
    position = routes // 2
    for k in range(runs):
        files[f"r{position}.yaml"] = _route(position, routes, f"/v{k + 2}")
        start = time.perf_counter()
        config = _merged(files, translator)
        merged = time.perf_counter()
        ctx = next_context(ctx, ctx.index.next(config, version=k + 1))
        _generate(ctx, proxy)
        end = time.perf_counter()
        merges.append(merged - start)
        totals.append(end - start)
    return merges, totals


def run(routes: int, runs: int) -> dict[str, float]:
    files = _files(routes)
    proxy = _router()
    full_merges, fulls = [], []
    for _ in range(runs):
        start = time.perf_counter()
        config = _merged(files, None)
        merged = time.perf_counter()
        ctx = GenContext(MeshIndex(config), ResourceCache())
        count = _generate(ctx, proxy)
        end = time.perf_counter()
        full_merges.append(merged - start)
        fulls.append(end - start)
    merges, pushes = _incremental(routes, runs, Translator())
    anew_merges, anew = _incremental(routes, runs, None)
    full_s, full_merge_s, merge_s, push_s, anew_s, anew_merge_s = (
        statistics.median(x) for x in (fulls, full_merges, merges, pushes, anew, anew_merges)
    )
    ratio = push_s / full_s
    print(
        f"gateway config from {routes} HTTPRoutes (one file each) through the Gateway API"
        f" translation, one router: full {full_s * 1000:.1f} ms ({count} resources;"
        f" translation and merge {full_merge_s * 1000:.1f} ms)"
    )
    print(
        f"gateway config from HTTPRoutes, one HTTPRoute edited: {push_s * 1000:.1f} ms"
        f" (translation and merge {merge_s * 1000:.1f} ms)"
        f"  (runs: {', '.join(f'{t * 1000:.1f}' for t in pushes)})"
    )
    print(
        f"gateway config from HTTPRoutes, one HTTPRoute edited with a Translator made anew"
        f" (every route translated): {anew_s * 1000:.1f} ms (translation and merge"
        f" {anew_merge_s * 1000:.1f} ms), 1/{full_s / anew_s:.0f} of full"
    )
    print(
        f"gateway config from HTTPRoutes ratio incremental/full: {ratio:.3f} = 1/{1 / ratio:.0f}"
        "  (target <= 1/20)"
    )
    return {
        "httproutes_full_ms": full_s * 1000,
        "httproutes_full_translation_ms": full_merge_s * 1000,
        "httproutes_incremental_ms": push_s * 1000,
        "httproutes_translation_ms": merge_s * 1000,
        "httproutes_translated_anew_ms": anew_s * 1000,
        "httproutes_ratio": ratio,
    }
