"""Traffic-management manifests shared by unit, validate and Envoy tests: builders for the
documents every traffic test starts from (a Service, its WorkloadEntries, version subsets, a
header route, a weighted TCP split), and TRAFFIC_YAML with every supported field of
VirtualService and DestinationRule, against the services of the validate mesh.

Each builder returns one YAML document led by `---`, so a mesh is their concatenation."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

import pytest

from control.config.loader import load_text
from control.config.merge import merge
from control.generate import route_tables
from control.model.index import MeshIndex
from control.model.traffic import VirtualService
from control.model.types import MeshConfig

HTTP_PORT = 9080


def _document(kind: str, name: str, namespace: str, *spec: str) -> str:
    """One document; `spec` are the lines below `spec:`."""
    api = "v1" if kind == "Service" else "networking.istio.io/v1"
    lines = ["---", f"apiVersion: {api}", f"kind: {kind}"]
    lines += [f"metadata: {{name: {name}, namespace: {namespace}}}", "spec:", *spec]
    return "\n" + "\n".join(lines) + "\n"


def service(
    name: str,
    app: str,
    port: int = HTTP_PORT,
    target: int | None = 8080,
    proto: str = "http",
    namespace: str = "default",
) -> str:
    """A Kubernetes Service selecting `app`, with one port (named `proto`); `target` None
    leaves targetPort out (the port itself)."""
    target_port = "" if target is None else f", targetPort: {target}"
    return _document(
        "Service",
        name,
        namespace,
        f"  selector: {{app: {app}}}",
        f"  ports: [{{name: {proto}, port: {port}{target_port}}}]",
    )


def workload_entry(name: str, ip: str, namespace: str = "default", **labels: str) -> str:
    shown = ", ".join(f"{k}: {v}" for k, v in labels.items())
    return _document(
        "WorkloadEntry", name, namespace, f'  address: "{ip}"', f"  labels: {{{shown}}}"
    )


def subsets_rule(
    name: str,
    subsets: tuple[str, ...] = ("v1", "v2"),
    *,
    host: str = "",
    label: str = "version",
    policy: str = "",
    namespace: str = "default",
) -> str:
    """A DestinationRule for `host` (default: `name`) with one subset per value of `label`,
    and `policy` (flow YAML) as its trafficPolicy when given."""
    spec = [f"  host: {host or name}"]
    if policy:
        spec.append(f"  trafficPolicy: {policy}")
    spec.append("  subsets:")
    spec += (f"  - {{name: {s}, labels: {{{label}: {s}}}}}" for s in subsets)
    return _document("DestinationRule", name, namespace, *spec)


def versioned_reviews(v1_ip: str, v2_ip: str) -> str:
    """Service reviews with one workload per version and the DestinationRule naming them as
    subsets v1 and v2."""
    return "".join(
        (
            service("reviews", "reviews"),
            workload_entry("reviews-v1", v1_ip, app="reviews", version="v1"),
            workload_entry("reviews-v2", v2_ip, app="reviews", version="v2"),
            subsets_rule("reviews"),
        )
    )


def header_route(name: str, marked: str = "v2", default: str = "v1") -> str:
    """A VirtualService for host `name`: requests with `end-user: jason` go to subset
    `marked`, all others to `default` (Istio's bookinfo example)."""
    return _document(
        "VirtualService",
        name,
        "default",
        f"  hosts: [{name}]",
        "  http:",
        "  - match: [{headers: {end-user: {exact: jason}}}]",
        f"    route: [{{destination: {{host: {name}, subset: {marked}}}}}]",
        f"  - route: [{{destination: {{host: {name}, subset: {default}}}}}]",
    )


def tcp_split(name: str, weights: Mapping[str, int]) -> str:
    """A VirtualService sending host `name`'s TCP traffic to its subsets by weight."""
    return _document(
        "VirtualService",
        name,
        "default",
        f"  hosts: [{name}]",
        "  tcp:",
        "  - route:",
        *(
            f"    - {{destination: {{host: {name}, subset: {subset}}}, weight: {weight}}}"
            for subset, weight in weights.items()
        ),
    )


def mesh_config(*parts: str, file: str = "mesh.yaml") -> MeshConfig:
    """The merged config of one file made of `parts` (dedented together)."""
    return merge([load_text(textwrap.dedent("".join(parts)), file)])


TRAFFIC_YAML = textwrap.dedent(
    """
    apiVersion: networking.istio.io/v1
    kind: DestinationRule
    metadata: {name: reviews, namespace: default}
    spec:
      host: reviews
      trafficPolicy:
        loadBalancer: {simple: LEAST_REQUEST}
        connectionPool:
          tcp: {maxConnections: 100, connectTimeout: 250ms}
          http: {http1MaxPendingRequests: 10, http2MaxRequests: 50, maxRequestsPerConnection: 3,
                 maxRetries: 4, idleTimeout: 30s}
        outlierDetection:
          consecutive5xxErrors: 2
          consecutiveGatewayErrors: 3
          interval: 1s
          baseEjectionTime: 30s
          maxEjectionPercent: 50
        portLevelSettings:
        - port: {number: 9080}
          loadBalancer: {simple: RANDOM}
      subsets:
      - name: v1
        labels: {version: v1}
      - name: v2
        labels: {version: v2}
        trafficPolicy:
          loadBalancer:
            consistentHash: {httpHeaderName: x-user}
    ---
    apiVersion: networking.istio.io/v1
    kind: DestinationRule
    metadata: {name: ratings, namespace: default}
    spec:
      host: ratings.default.svc.cluster.local
      trafficPolicy:
        tls: {mode: ISTIO_MUTUAL}
        loadBalancer:
          consistentHash:
            httpCookie: {name: session, ttl: 60s, path: /}
      subsets:
      - name: canary
        labels: {track: canary}
        trafficPolicy:
          tls: {mode: DISABLE}
          loadBalancer: {consistentHash: {useSourceIp: true}}
    ---
    apiVersion: networking.istio.io/v1
    kind: DestinationRule
    metadata: {name: mirror, namespace: external}
    spec:
      host: mirror.example
      trafficPolicy:
        tls: {mode: SIMPLE, sni: mirror.example, subjectAltNames: [mirror.example]}
      subsets:
      - name: eu
        labels: {region: eu}
    ---
    apiVersion: networking.istio.io/v1
    kind: DestinationRule
    metadata: {name: legacy, namespace: external}
    spec:
      host: legacy.corp
      trafficPolicy:
        tls: {mode: SIMPLE, insecureSkipVerify: true}
        loadBalancer: {consistentHash: {httpQueryParameterName: user, maglev: {}}}
    ---
    apiVersion: networking.istio.io/v1
    kind: DestinationRule
    metadata: {name: db, namespace: default}
    spec:
      host: db
      trafficPolicy:
        loadBalancer: {consistentHash: {useSourceIp: true, minimumRingSize: 64}}
      subsets:
      - {name: primary, labels: {role: primary}}
      - {name: replica, labels: {role: replica}}
    ---
    apiVersion: networking.istio.io/v1
    kind: VirtualService
    metadata: {name: reviews, namespace: default}
    spec:
      hosts: [reviews]
      gateways: [mesh]
      http:
      - name: marked
        match:
        - headers: {end-user: {exact: jason}}
          uri: {prefix: /api}
          ignoreUriCase: true
        - queryParams: {v: {exact: "2"}}
          method: {exact: GET}
          withoutHeaders: {x-skip: {}}
        - uri: {regex: "/re/[0-9]+"}
          authority: {prefix: reviews}
          port: 9080
        route:
        - destination: {host: reviews, subset: v2}
      - name: rewrite
        match: [{uri: {exact: /old}}]
        rewrite: {uri: /new, authority: reviews.internal}
        timeout: 1.5s
        retries: {attempts: 3, perTryTimeout: 500ms, retryOn: "5xx,gateway-error,503"}
        route:
        - destination: {host: reviews, subset: v1}
      - name: regex-rewrite
        match: [{uri: {prefix: /rx}}]
        rewrite: {uriRegexRewrite: {match: "^/rx/(.*)$", rewrite: "/\\\\1"}}
        route:
        - destination: {host: reviews}
      - name: moved
        match: [{uri: {prefix: /moved}}]
        redirect: {uri: /here, authority: ratings, redirectCode: 308, scheme: https, port: 8443}
      - name: faulty
        match: [{uri: {prefix: /fault}}]
        fault:
          delay: {fixedDelay: 2s, percentage: {value: 10}}
          abort: {httpStatus: 503, percentage: {value: 50.5}}
        route:
        - destination: {host: reviews, subset: v1}
      - name: split
        mirror: {host: ratings}
        mirrorPercentage: {value: 25}
        headers:
          request: {set: {x-a: "1"}, add: {x-b: "2"}, remove: [x-c]}
          response: {set: {x-d: "3"}, add: {x-e: "4"}, remove: [server]}
        route:
        - destination: {host: reviews, subset: v1}
          weight: 90
          headers: {request: {set: {x-version: v1}}}
        - destination: {host: reviews, subset: v2, port: {number: 9080}}
          weight: 10
    ---
    apiVersion: networking.istio.io/v1
    kind: VirtualService
    metadata: {name: db, namespace: default}
    spec:
      hosts: [db]
      tcp:
      - match: [{port: 3306}]
        route:
        - destination: {host: db, subset: primary}
          weight: 80
        - destination: {host: db, subset: replica}
          weight: 20
    """
)


def traffic_config() -> MeshConfig:
    return mesh_config(TRAFFIC_YAML, file="traffic.yaml")


def count_translations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the VirtualServices route_tables translates from now on, one entry per
    translation (`vs_routes` call), for tests of what is carried rather than made again."""
    translated: list[str] = []
    original = route_tables.vs_routes

    def vs_routes(index: MeshIndex, vs: VirtualService, *args: Any) -> Any:
        translated.append(vs.name)
        return original(index, vs, *args)

    monkeypatch.setattr(route_tables, "vs_routes", vs_routes)
    return translated
