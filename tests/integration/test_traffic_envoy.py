"""Acceptance: VirtualService and DestinationRule behave as Istio documents them, measured
with real Envoy (connected straight to the control plane) and real HTTP and TCP backends that
answer with their own version. Statistical checks use tolerances of about three standard
deviations of the binomial, never timings."""

from __future__ import annotations

import asyncio
import base64
import json
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.envoy.bootstrap import BootstrapOptions, build_bootstrap
from tests.support.apps import EchoApp, TcpEchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.envoy import EnvoyProcess
from tests.support.net import pod_ip
from tests.support.traffic import (
    HTTP_PORT,
    header_route,
    service,
    subsets_rule,
    tcp_split,
    workload_entry,
)

pytestmark = pytest.mark.envoy

TCP_PORT = 9000
# A direct response body far above Envoy's default limit (4 KB), below Istio's (1 MiB),
# with every byte value.
LARGE_BODY = bytes(range(256)) * 800


def mesh_yaml(ips: dict[str, str]) -> str:
    docs = [
        service("reviews", "reviews"),
        service("split", "reviews"),
        service("faults", "reviews"),
        service("maintenance", "reviews"),
        service("canary", "reviews"),
        service("slow", "reviews"),
        service("delayed", "reviews"),
        service("flaky", "flaky"),
        service("outlier", "outlier"),
        service("tcpecho", "tcpecho", TCP_PORT, TCP_PORT, "tcp"),
        workload_entry("reviews-v1", ips["v1"], app="reviews", version="v1"),
        workload_entry("reviews-v2", ips["v2"], app="reviews", version="v2"),
        workload_entry("flaky-1", ips["flaky"], app="flaky"),
        workload_entry("outlier-good", ips["good"], app="outlier"),
        workload_entry("outlier-bad", ips["bad"], app="outlier"),
        workload_entry("tcp-v1", ips["tcp1"], app="tcpecho", version="v1"),
        workload_entry("tcp-v2", ips["tcp2"], app="tcpecho", version="v2"),
    ]
    rules = [
        subsets_rule("reviews"),
        subsets_rule("canary"),
        subsets_rule(
            "split",
            host="split.default.svc.cluster.local",
            policy="{loadBalancer: {simple: ROUND_ROBIN}}",
        ),
        header_route("reviews"),
        """
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: split, namespace: default}
spec:
  hosts: [split]
  http:
  - route:
    - {destination: {host: split, subset: v1}, weight: 90}
    - {destination: {host: split, subset: v2}, weight: 10}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: faults, namespace: default}
spec:
  hosts: [faults]
  http:
  - fault: {abort: {httpStatus: 418, percentage: {value: 50}}}
    route: [{destination: {host: faults}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: maintenance, namespace: default}
spec:
  hosts: [maintenance]
  http:
  - match: [{uri: {prefix: /down}}]
    directResponse: {status: 503, body: {string: "down for maintenance"}}
    headers: {response: {set: {x-maintenance: "yes"}}}
  - match: [{uri: {exact: /bytes}}]
    directResponse: {status: 200, body: {bytes: "AAEC/w=="}}
  - match: [{uri: {exact: /large}}]
    directResponse: {status: 200, body: {bytes: "LARGE_BODY"}}
  - match: [{uri: {exact: /scheme}, scheme: {exact: https}}]
    directResponse: {status: 418}
  - match: [{uri: {exact: /scheme}, scheme: {exact: http}}]
    directResponse: {status: 200, body: {string: plain}}
  - match: [{uri: {prefix: /}, statPrefix: maintenance-app}]
    route: [{destination: {host: maintenance}}]
    corsPolicy:
      allowOrigins: [{exact: "https://shop.example"}]
      allowMethods: [GET, POST]
      exposeHeaders: [x-app]
      maxAge: 1h
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: canary, namespace: default}
spec:
  hosts: [canary]
  http:
  - match: [{sourceLabels: {app: nobody}}]
    directResponse: {status: 418}
  - match: [{sourceLabels: {app: client}}]
    route: [{destination: {host: canary, subset: v2}}]
  - route: [{destination: {host: canary, subset: v1}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: slow, namespace: default}
spec:
  hosts: [slow]
  http:
  - timeout: 0.3s
    rewrite: {authority: delayed}
    route: [{destination: {host: loop.internal}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: delayed, namespace: default}
spec:
  hosts: [delayed]
  http:
  - fault: {delay: {fixedDelay: 30s, percentage: {value: 100}}}
    route: [{destination: {host: delayed}}]
---
# The client's own outbound listener as a destination: a second hop through the same Envoy,
# standing in for the callee's sidecar (Envoy's fault delay runs before its own router, so
# the timeout that cuts a delay is the caller's, as in Istio's bookinfo example).
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: loop, namespace: default}
spec:
  hosts: [loop.internal]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP}]
  endpoints: [{address: "CLIENT_IP"}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: flaky, namespace: default}
spec:
  hosts: [flaky]
  http:
  - retries: {attempts: 3, retryOn: 5xx}
    route: [{destination: {host: flaky}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: outlier, namespace: default}
spec:
  host: outlier
  trafficPolicy:
    loadBalancer: {simple: ROUND_ROBIN}
    outlierDetection:
      consecutive5xxErrors: 1
      interval: 1s
      baseEjectionTime: 5m
      maxEjectionPercent: 100
""".replace("CLIENT_IP", ips["client"]).replace(
            "LARGE_BODY", base64.b64encode(LARGE_BODY).decode()
        ),
        subsets_rule("tcpecho"),
        tcp_split("tcpecho", {"v1": 80, "v2": 20}),
        """
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: scoped, namespace: default}
spec:
  workloadSelector: {labels: {app: scoped}}
  egress:
  - hosts: [./reviews.default.svc.cluster.local]
""",
    ]
    return "".join(docs + rules)


class Client:
    """HTTP requests through one Envoy's outbound listener, keeping the connection."""

    def __init__(self, ip: str) -> None:
        self.ip = ip
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))

    async def get(self, host: str, path: str = "/", **headers: str) -> tuple[int, str]:
        """(status, app name or "")."""
        try:
            async with self.session.get(
                f"http://{self.ip}:{HTTP_PORT}{path}", headers={"Host": host, **headers}
            ) as r:
                text = await r.text()
                if r.status != 200:
                    return r.status, ""
                return r.status, str(json.loads(text)["app"])
        except (aiohttp.ClientError, TimeoutError):
            return 0, ""

    async def tally(self, n: int, host: str, **headers: str) -> Counter[tuple[int, str]]:
        return Counter([await self.get(host, **headers) for _ in range(n)])

    async def close(self) -> None:
        await self.session.close()


async def tcp_hello(ip: str) -> str:
    """Connect to the TCP listener, read the backend's greeting, check it echoes."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(ip, TCP_PORT), 5)
    except (OSError, TimeoutError):
        return ""
    try:
        greeting = (await asyncio.wait_for(reader.readline(), 5)).decode().strip()
        writer.write(b"ping\n")
        await writer.drain()
        echoed = (await asyncio.wait_for(reader.readline(), 5)).decode().strip()
        return greeting if echoed == "ping" else ""
    except (OSError, TimeoutError):
        return ""
    finally:
        writer.close()


def envoy_for(cp: Any, ip: str, pod: str, labels: dict[str, str], workdir: Path) -> EnvoyProcess:
    boot = build_bootstrap(
        BootstrapOptions(ip=ip, pod_name=pod, labels=labels, xds_address=f"127.0.0.1:{cp.xds_port}")
    )
    envoy = EnvoyProcess(boot, workdir, name=pod)
    envoy.start()
    return envoy


def dynamic_counts(dump: dict[str, Any]) -> tuple[int, int]:
    """(listeners, clusters) Envoy holds from xDS."""
    listeners = clusters = 0
    for section in dump["configs"]:
        if section["@type"].endswith("ListenersConfigDump"):
            listeners = len(section.get("dynamic_listeners", []))
        if section["@type"].endswith("ClustersConfigDump"):
            clusters = len(section.get("dynamic_active_clusters", []))
    return listeners, clusters


async def test_traffic_management_with_real_envoy(tmp_path: Path) -> None:
    names = ("v1", "v2", "flaky", "good", "bad", "tcp1", "tcp2", "client", "scoped")
    ips = {n: pod_ip() for n in names}
    apps = [
        EchoApp("v1", ips["v1"], 8080),
        EchoApp("v2", ips["v2"], 8080),
        EchoApp("flaky", ips["flaky"], 8080, fail_every=2),
        EchoApp("good", ips["good"], 8080),
        EchoApp("bad", ips["bad"], 8080, fail_every=1, fail_status=503),
    ]
    tcp_apps = [TcpEchoApp("v1", ips["tcp1"], TCP_PORT), TcpEchoApp("v2", ips["tcp2"], TCP_PORT)]
    for app in [*apps, *tcp_apps]:
        await app.start()
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(textwrap.dedent(mesh_yaml(ips)))
    client = Client(ips["client"])
    scoped_client = Client(ips["scoped"])
    envoys: list[EnvoyProcess] = []
    try:
        async with running_control_plane(cfg) as cp:
            assert not cp.watcher.errors
            warnings = [str(w) for w in cp.watcher.current.warnings]
            assert warnings == [], warnings
            envoy = envoy_for(cp, ips["client"], "client", {"app": "client"}, tmp_path / "e1")
            scoped = envoy_for(cp, ips["scoped"], "scoped", {"app": "scoped"}, tmp_path / "e2")
            envoys += [envoy, scoped]
            await eventually(
                lambda: _is(client.get("reviews"), (200, "v1")), timeout=30, what="routes"
            )

            # Subsets route by label; a header match sends only marked traffic to v2.
            assert await client.tally(100, "reviews") == {(200, "v1"): 100}
            assert await client.tally(100, "reviews", **{"end-user": "jason"}) == {(200, "v2"): 100}
            assert await client.tally(50, "reviews", **{"end-user": "mallory"}) == {(200, "v1"): 50}

            # 90/10 split over 2,000 requests: v2 gets 10% +- 3 points (sigma is 0.67).
            split = await client.tally(2000, "split")
            assert split[(200, "v1")] + split[(200, "v2")] == 2000, split
            assert 7.0 <= 100 * split[(200, "v2")] / 2000 <= 13.0, split

            # Abort fault at 50%: the fault's status for 50% +- 5 points of 1,000 (sigma 1.6).
            faults = await client.tally(1000, "faults")
            aborted = faults[(418, "")]
            assert aborted + sum(n for (s, _), n in faults.items() if s == 200) == 1000, faults
            assert 45.0 <= 100 * aborted / 1000 <= 55.0, faults

            # Direct responses: Envoy answers by itself (status, body, response headers); the
            # backend never sees those paths, and other paths still reach it.
            served_before = apps[0].requests + apps[1].requests
            url = f"http://{ips['client']}:{HTTP_PORT}"
            async with client.session.get(f"{url}/down/now", headers={"Host": "maintenance"}) as r:
                assert (r.status, await r.text()) == (503, "down for maintenance")
                assert r.headers["x-maintenance"] == "yes"
            async with client.session.get(f"{url}/bytes", headers={"Host": "maintenance"}) as r:
                assert (r.status, await r.read()) == (200, bytes([0, 1, 2, 255]))
            async with client.session.get(f"{url}/large", headers={"Host": "maintenance"}) as r:
                assert (r.status, await r.read()) == (200, LARGE_BODY)
            assert apps[0].requests + apps[1].requests == served_before
            # scheme: the request's :scheme (plaintext from the app: http).
            async with client.session.get(f"{url}/scheme", headers={"Host": "maintenance"}) as r:
                assert (r.status, await r.text()) == (200, "plain")
            assert (await client.get("maintenance", "/up"))[0] == 200
            assert apps[0].requests + apps[1].requests == served_before + 1
            # statPrefix: Envoy counts that route's requests under it.
            routed = "vhost.maintenance.default.svc.cluster.local:9080.route.maintenance-app"
            assert await envoy.stat(routed + ".upstream_rq_completed") == 1

            # CORS: Envoy answers an allowed origin's preflight itself, marks the allowed
            # origin's responses, and leaves other origins' unmarked; a preflight from an
            # origin that matches nothing goes on to the app (unmatchedPreflights FORWARD).
            shop = {"Host": "maintenance", "Origin": "https://shop.example"}
            preflight = {**shop, "Access-Control-Request-Method": "POST"}
            served_before = apps[0].requests + apps[1].requests
            async with client.session.options(f"{url}/cart", headers=preflight) as r:
                assert r.status == 200
                assert r.headers["access-control-allow-origin"] == "https://shop.example"
                assert r.headers["access-control-allow-methods"] == "GET,POST"
                assert r.headers["access-control-max-age"] == "3600"
            assert apps[0].requests + apps[1].requests == served_before
            async with client.session.get(f"{url}/cart", headers=shop) as r:
                assert r.status == 200
                assert r.headers["access-control-allow-origin"] == "https://shop.example"
                assert r.headers["access-control-expose-headers"] == "x-app"
            evil = {"Host": "maintenance", "Origin": "https://evil.example"}
            async with client.session.get(f"{url}/cart", headers=evil) as r:
                assert r.status == 200 and "access-control-allow-origin" not in r.headers
            before_forwarded = apps[0].requests + apps[1].requests
            evil_preflight = {**evil, "Access-Control-Request-Method": "POST"}
            async with client.session.options(f"{url}/cart", headers=evil_preflight) as r:
                assert "access-control-allow-origin" not in r.headers
            assert apps[0].requests + apps[1].requests == before_forwarded + 1

            # sourceLabels: this Envoy's workload (app=client) gets its match's route, never
            # the one of a match for other clients' labels.
            assert await client.tally(50, "canary") == {(200, "v2"): 50}

            # A 30s delay behind a route with a 0.3s timeout: 504 from Envoy, long before the
            # delay ends (the client gives up after 10s: a missing timeout shows as status 0).
            assert await client.get("slow") == (504, "")

            # Retries: the backend fails every other request, the client sees none of it.
            flaky = await client.tally(200, "flaky")
            assert flaky == {(200, "flaky"): 200}, flaky
            assert apps[2].failures >= 100  # the failures happened, retries hid them

            # Outlier detection: the backend answering 503 is ejected, traffic moves.
            first = await client.tally(20, "outlier")
            assert first[(503, "")] >= 1, first  # it was tried before being ejected
            assert await client.tally(100, "outlier") == {(200, "good"): 100}

            # TCP: weighted 80/20 across two versions over 500 connections (sigma 1.8).
            tcp = Counter([await tcp_hello(ips["client"]) for _ in range(500)])
            assert tcp["v1"] + tcp["v2"] == 500, tcp
            assert 14.0 <= 100 * tcp["v2"] / 500 <= 26.0, tcp

            # Sidecar egress scoping: fewer listeners and clusters; out-of-scope hosts are
            # not routed.
            await eventually(
                lambda: _is(scoped_client.get("reviews"), (200, "v1")), timeout=30, what="scoped"
            )
            full = dynamic_counts(await envoy.config_dump())
            small = dynamic_counts(await scoped.config_dump())
            # reviews' listener only (no TCP 9000 listener); its 3 clusters plus the 2 fixed.
            assert small == (1, 5), small
            assert full[0] > small[0] and full[1] > small[1], (full, small)
            assert (await scoped_client.get("split"))[0] == 404
            assert await tcp_hello(ips["scoped"]) == ""
    finally:
        for e in envoys:
            e.stop()
        await client.close()
        await scoped_client.close()
        for app in [*apps, *tcp_apps]:
            await app.close()


async def _is(call: Any, want: tuple[int, str]) -> bool:
    return bool(await call == want)
