"""A pod's app for network-namespace tests, run as its own process inside the pod:

- `serve NAME PORT [dual]`: an HTTP server on 0.0.0.0:PORT (`dual`: [::]:PORT, IPv4 and
  IPv6) answering JSON with its name, the Host, the caller's address and the
  `x-forwarded-client-cert` header the sidecar set (so a test can see the caller's SPIFFE ID);
- `grpc-health PORT`: a gRPC server on 0.0.0.0:PORT with only the standard health service
  (grpcio-health-checking), SERVING;
- `get URL [HOST]`: one plain HTTP GET (that Host header when given) with the standard
  library (system resolver, no proxy settings: an app that knows nothing of the mesh),
  printing `STATUS BODY` or `ERROR why`.
"""

from __future__ import annotations

import json
import socket
import sys
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _DualStackServer(ThreadingHTTPServer):
    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def serve(name: str, port: int, dual: bool = False) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(
                {
                    "app": name,
                    "host": self.headers.get("Host", ""),
                    "peer": self.client_address[0],
                    "xfcc": self.headers.get("x-forwarded-client-cert", ""),
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    if dual:
        _DualStackServer(("::", port), Handler).serve_forever()
    ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()


def grpc_health(port: int) -> None:
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    server.add_insecure_port(f"0.0.0.0:{port}")
    server.start()
    server.wait_for_termination()


def get(url: str, host: str = "") -> str:
    # No proxies even if the environment had some: the app must reach the mesh unaided.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with opener.open(request, timeout=5) as r:
            return f"{r.status} {r.read().decode()}"
    except urllib.error.HTTPError as e:
        return f"{e.code} {e.read().decode(errors='replace')}"
    except (OSError, urllib.error.URLError) as e:
        return f"ERROR {e}"


def main(argv: list[str]) -> None:
    if argv[:1] == ["serve"] and len(argv) in (3, 4) and argv[3:] in ([], ["dual"]):
        serve(argv[1], int(argv[2]), dual=argv[3:] == ["dual"])
    elif argv[:1] == ["grpc-health"] and len(argv) == 2:
        grpc_health(int(argv[1]))
    elif argv[:1] == ["get"] and len(argv) in (2, 3):
        print(get(*argv[1:]))
    else:
        sys.exit(
            "usage: podapp serve NAME PORT [dual] | podapp grpc-health PORT | podapp get URL [HOST]"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
