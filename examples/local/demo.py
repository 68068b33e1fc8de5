"""`make demo`: a local mesh on loopback pod IPs, with an ingress gateway.

Starts the control plane (`pilotfish-control --config` mesh.yaml, gateway.yaml and
demo-gateway-secret.yaml of examples/local) and four pods, each `pilotfish-agent` (which
generates Envoy's bootstrap and runs Envoy) on its own loopback IP: a client at 127.0.1.1,
reviews and ratings at 127.0.1.2 / 127.0.1.3 with a small HTTP app next to their agent, and
the ingress gateway at 127.0.1.4 (`--proxy-type router`). Each agent gets a token from
`pilotfish-ctl token`, talks to the control plane over its TLS port (15012, verified against
the root in the state dir), and gets a workload certificate for its service account, which its
Envoy uses for mTLS (the mesh is STRICT). The reviews and ratings agents register their pods
through the WorkloadGroups of mesh.yaml (`--workload-group`), which admit only their own
service account. Requests go to the client's outbound listener 127.0.1.1:9080, are routed by
Host header, and reach each app through its own Envoy; the apps print the caller's SPIFFE
identity from `x-forwarded-client-cert`.

The router is labelled `gateway.networking.k8s.io/gateway-name=ingress`, so it serves the
Gateway API Gateway `ingress` of gateway.yaml: HTTP on 127.0.1.4:8080 and HTTPS for
demo.example.com on 127.0.1.4:8443 with the certificate of the Secret in
demo-gateway-secret.yaml (over SDS, `kubernetes://demo-gateway-cert`); its HTTPRoute sends
/reviews and /ratings to those Services. The demo requests both through it (the HTTPS one
verifying the chain against demo-root.pem with SNI demo.example.com) and prints the same
requests as curl lines. That certificate and key are committed demo material
(make-demo-cert.py regenerates them): never trust them elsewhere.

Ctrl-C stops everything cleanly (the e2e test stops it so, after its own requests through
the gateway); `--once` exits after the traffic check. At the end it prints how to scrape the
demo with Prometheus (examples/observability/prometheus-local.yml) and a PromQL query that
shows its traffic in Istio's standard metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

CLIENT_IP = "127.0.1.1"
APPS = {"reviews": "127.0.1.2", "ratings": "127.0.1.3"}
CONFIG_FILES = ("mesh.yaml", "gateway.yaml", "demo-gateway-secret.yaml")
# The ingress gateway's router pod and what gateway.yaml has it serve.
GATEWAY = "ingress"
GATEWAY_IP = "127.0.1.4"
GATEWAY_HOST = "demo.example.com"
GATEWAY_HTTP_PORT, GATEWAY_HTTPS_PORT = 8080, 8443
DEMO_ROOT = HERE / "demo-root.pem"
# The demo's requests as the destination sidecars count them (Istio's standard metric).
TRAFFIC_QUERY = (
    "sum by (source_workload, destination_service, response_code) "
    '(rate(istio_requests_total{reporter="destination", '
    'destination_service_namespace="default"}[1m]))'
)
PROMETHEUS_COMMAND = (
    "prometheus --config.file=examples/observability/prometheus-local.yml "
    "--storage.tsdb.path=/tmp/pilotfish-prometheus --web.listen-address=127.0.0.1:9090"
)


async def start_app(name: str, ip: str) -> web.AppRunner:
    async def handle(request: web.Request) -> web.Response:
        caller = caller_identity(request.headers.get("x-forwarded-client-cert", ""))
        body = {"app": name, "pod_ip": ip, "path": request.path, "caller": caller}
        return web.json_response(body)

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, ip, 8080, reuse_address=True).start()
    return runner


def caller_identity(xfcc: str) -> str:
    """The caller's SPIFFE ID from Envoy's x-forwarded-client-cert (`By=...;URI=...`)."""
    for element in xfcc.split(","):
        for part in element.split(";"):
            key, _, value = part.partition("=")
            if key.strip().lower() == "uri":
                return value.strip('"')
    return "(no client certificate)"


def mint_token(state_dir: Path, service_account: str, path: Path) -> None:
    """`pilotfish-ctl token` for the pod's service account, written as its --token-file."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "control.ctl",
            "token",
            "--state-dir",
            str(state_dir),
            "--namespace",
            "default",
            "--service-account",
            service_account,
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(0o600)
    path.write_text(out.stdout.strip())


async def plaintext_refused(ip: str) -> str:
    """What a client without a mesh certificate gets from an app's inbound port."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s,
            s.get(f"http://{ip}:9080/") as r,
        ):
            return f"HTTP {r.status}"
    except (aiohttp.ClientError, TimeoutError) as e:
        return f"refused ({type(e).__name__})"


def busy_addresses() -> list[tuple[str, int]]:
    """The fixed addresses the demo needs that something else already holds."""
    wanted = [("127.0.0.1", p) for p in (15010, 15012, 15014, 15017)]
    for ip in (CLIENT_IP, *APPS.values()):
        wanted += [(ip, p) for p in (9080, 15000, 15020, 15021)]
    wanted += [(ip, 8080) for ip in APPS.values()]
    wanted += [
        (GATEWAY_IP, p) for p in (GATEWAY_HTTP_PORT, GATEWAY_HTTPS_PORT, 15000, 15020, 15021)
    ]
    busy = []
    for host, port in wanted:
        with socket.socket() as s:
            # As the servers themselves bind: a previous run's TIME_WAIT connections on
            # these ports do not count, only a socket listening there does.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                busy.append((host, port))
    return busy


def say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


async def wait_http(url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as s:
        while time.monotonic() < deadline:
            try:
                async with s.get(url) as r:
                    if r.status == 200:
                        return True
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.2)
    return False


async def fetch(
    url: str, host: str, tls: ssl.SSLContext | None = None, sni: str | None = None
) -> tuple[int, str]:
    """One GET with `Host: host`; for HTTPS, `tls` verifies the server named `sni`."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s,
            s.get(
                url,
                headers={"Host": host},
                ssl=tls if tls is not None else True,
                server_hostname=sni,
            ) as r,
        ):
            text = await r.text()
            return r.status, text
    except (aiohttp.ClientError, TimeoutError) as e:
        return 0, str(e)


async def fetch_json(
    url: str, host: str, tls: ssl.SSLContext | None = None, sni: str | None = None
) -> tuple[int, dict[str, str], str]:
    """`fetch` retried until 200 (config still arriving) or 20 s; (status, JSON body, text)."""
    deadline = time.monotonic() + 20
    status, text = 0, ""
    while time.monotonic() < deadline:
        status, text = await fetch(url, host, tls, sni)
        if status == 200:
            break
        await asyncio.sleep(0.2)
    try:
        body = json.loads(text) if status == 200 else {}
    except ValueError:
        body = {}
    return status, body if isinstance(body, dict) else {}, text


def gateway_curl_lines() -> list[str]:
    """The gateway requests the demo makes, as the curl commands a user types."""
    root = os.path.relpath(DEMO_ROOT)
    return [
        f"curl -H 'Host: {GATEWAY_HOST}' http://{GATEWAY_IP}:{GATEWAY_HTTP_PORT}/reviews",
        f"curl --resolve {GATEWAY_HOST}:{GATEWAY_HTTPS_PORT}:{GATEWAY_IP} --cacert {root} "
        f"https://{GATEWAY_HOST}:{GATEWAY_HTTPS_PORT}/ratings",
    ]


async def check_gateway() -> bool:
    """GET /reviews over HTTP and /ratings over HTTPS through the ingress gateway, each
    answered by its app and reaching it as the gateway's mesh identity."""
    tls = await asyncio.to_thread(ssl.create_default_context, cafile=str(DEMO_ROOT))
    http = f"http://{GATEWAY_IP}:{GATEWAY_HTTP_PORT}/reviews"
    https = f"https://{GATEWAY_IP}:{GATEWAY_HTTPS_PORT}/ratings"
    ok = True
    for app, url, context, what in (
        ("reviews", http, None, "HTTP"),
        ("ratings", https, tls, f"HTTPS, SNI {GATEWAY_HOST}, chain verified against demo-root"),
    ):
        sni = GATEWAY_HOST if context is not None else None
        status, body, text = await fetch_json(url, GATEWAY_HOST, context, sni)
        caller = str(body.get("caller", ""))
        if body.get("app") == app and caller.endswith(f"/ns/default/sa/{GATEWAY}"):
            say(f"gateway GET {url} Host: {GATEWAY_HOST} ({what}) -> {body}")
            continue
        ok = False
        say(f"gateway GET {url} Host: {GATEWAY_HOST} ({what}) failed: {status} {text[:200]}")
        if "CERTIFICATE_VERIFY_FAILED" in text:
            say(
                "(if the demo certificate expired or does not match demo-root.pem, "
                "regenerate both: python examples/local/make-demo-cert.py)"
            )
    return ok


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--once", action="store_true", help="exit after the traffic check")
    ap.add_argument("--delta", action="store_true", help="Envoy uses delta ADS")
    args = ap.parse_args()
    missing = [p for p in (*(HERE / f for f in CONFIG_FILES), DEMO_ROOT) if not p.is_file()]
    if missing:
        say(
            "cannot start: missing "
            + ", ".join(map(str, missing))
            + " (restore them from git, or python examples/local/make-demo-cert.py)"
        )
        return 1
    busy = busy_addresses()
    if busy:
        say(
            "cannot start: already in use: "
            + ", ".join(f"{h}:{p}" for h, p in busy)
            + " (is another demo or control plane running?)"
        )
        return 1

    work = Path(tempfile.mkdtemp(prefix="pilotfish-demo-"))
    say(f"work dir {work}")
    procs: list[subprocess.Popen[bytes]] = []
    runners: list[web.AppRunner] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    rc = 0
    try:
        cp_log = (work / "control.log").open("wb")
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "control",
                    *(a for f in CONFIG_FILES for a in ("--config", str(HERE / f))),
                    "--state-dir",
                    str(work / "state"),
                    "--id",
                    "demo",
                ],
                cwd=ROOT,
                stdout=cp_log,
                stderr=subprocess.STDOUT,
            )
        )
        if not await wait_http("http://127.0.0.1:15014/ready", 20):
            say(f"control plane did not become ready; see {work / 'control.log'}")
            return 1
        say(
            "control plane ready: agents on TLS 127.0.0.1:15012 (ADS + CA, tokens), "
            "plaintext 127.0.0.1:15010 for debugging only, debug on http://127.0.0.1:15014"
        )
        for name, ip in APPS.items():
            runners.append(await start_app(name, ip))
            say(f"app {name} listening on {ip}:8080")
        pods = {"client": CLIENT_IP, **APPS, GATEWAY: GATEWAY_IP}
        for pod, ip in pods.items():
            await asyncio.to_thread(mint_token, work / "state", pod, work / pod / "token")
            log = (work / f"{pod}-agent.log").open("wb")
            if pod == GATEWAY:
                # A router, found by the control plane as Gateway `ingress` by this label.
                role = [
                    "--proxy-type",
                    "router",
                    "--labels",
                    f"app={pod},gateway.networking.k8s.io/gateway-name={GATEWAY}",
                ]
            else:
                # The apps' pods join their WorkloadGroup; the client registers nothing.
                role = ["--labels", f"app={pod}"]
                role += ["--workload-group", pod] if pod in APPS else []
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "agent",
                        "--ip",
                        ip,
                        "--pod-name",
                        pod,
                        *role,
                        "--service-account",
                        pod,
                        "--control-plane",
                        "127.0.0.1:15012",
                        "--ca-root-cert",
                        str(work / "state" / "root-cert.pem"),
                        "--workdir",
                        str(work / pod),
                        "--drain-duration",
                        "1",
                        *(["--envoy-delta"] if args.delta else []),
                    ],
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            kind = "router (ingress gateway)" if pod == GATEWAY else "agent"
            say(
                f"pod {pod} at {ip}: {kind} + Envoy, service account {pod} "
                f"(status http://{ip}:15020/healthz/ready)"
            )
        for pod, ip in pods.items():
            if not await wait_http(f"http://{ip}:15020/healthz/ready", 30):
                say(f"pod {pod} did not become ready; see {work / (pod + '-agent.log')}")
                return 1
        say("all pods ready")
        ok = True
        for host in ("reviews", "ratings.default.svc.cluster.local:9080"):
            status, body, text = await fetch_json(f"http://{CLIENT_IP}:9080/demo", host)
            if str(body.get("caller", "")).startswith("spiffe://"):
                say(f"GET http://{CLIENT_IP}:9080/demo Host: {host} -> {body}")
            else:
                ok = False
                say(f"GET Host: {host} failed: {status} {text[:200]}")
        refused = await plaintext_refused(APPS["reviews"])
        say(f"plaintext GET http://{APPS['reviews']}:9080/ without a mesh certificate: {refused}")
        if refused.startswith("HTTP 2"):
            ok = False
        ok = await check_gateway() and ok
        for line in gateway_curl_lines():
            say(f"through the ingress gateway: {line}")
        say("registered through WorkloadGroups: " + json.dumps(await registered_summary()))
        say("syncz: " + json.dumps(await syncz_summary()))
        say(f"metrics: scrape the mesh with `{PROMETHEUS_COMMAND}`")
        say(f"PromQL for the demo's traffic: {TRAFFIC_QUERY}")
        say(
            "control plane metrics: http://127.0.0.1:15014/metrics "
            "(dashboards: examples/observability)"
        )
        if not ok:
            rc = 1
        elif not args.once:
            say("try: curl -H 'Host: reviews' http://127.0.1.1:9080/")
            for line in gateway_curl_lines():
                say(f"try: {line}")
            say("Ctrl-C to stop")
            await stop.wait()
    finally:
        for r in runners:
            await r.cleanup()
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        say("stopped")
    return rc


async def registered_summary() -> list[str]:
    async with aiohttp.ClientSession() as s, s.get("http://127.0.0.1:15014/debug/configz") as r:
        data = await r.json()
    return [
        f"{e['metadata']['name']} ({e['status']['identity']})" for e in data.get("registered", [])
    ]


async def syncz_summary() -> list[dict[str, str]]:
    async with aiohttp.ClientSession() as s, s.get("http://127.0.0.1:15014/debug/syncz") as r:
        data = await r.json()
    return [
        {"proxy": e["proxy"], **{t.rsplit(".", 1)[-1]: v["status"] for t, v in e["types"].items()}}
        for e in data
    ]


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(asyncio.run(main()))
