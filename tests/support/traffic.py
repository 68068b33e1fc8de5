"""Traffic-management manifests shared by unit and validate tests: every supported field of
VirtualService and DestinationRule, against the services of the validate mesh."""

from __future__ import annotations

import textwrap

from control.config.loader import load_text
from control.config.merge import merge
from control.model.types import MeshConfig

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
    return merge([load_text(TRAFFIC_YAML, "traffic.yaml")])
