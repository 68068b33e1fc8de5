"""Debug access (issue 18 item 3; DESIGN "Debug access"): `/debug/*` on a non-loopback
`--http-address` needs a bearer token of an identity in `--debug-allow`; `/ready` and
`/metrics` stay open; loopback stays open; syncz over xDS on the TLS port shows an allowed
caller every stream and any other caller its own namespace's.

A real control plane, real sockets. The sandbox has no non-loopback address to bind outside
a network namespace, so most tests force the judgement (`debug_requires_auth=True`) while
bound to 127.0.0.1; `test_real_non_loopback_address_in_a_network_namespace` runs
pilotfish-control bound to 10.250.x.y on an interface inside a namespace of its own, to
show the judgement by address (and the `--debug-allow` flag) end to end.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest
from envoy.service.status.v3.csds_pb2 import ClientConfig

from control.app import ControlPlane, ControlPlaneOptions
from control.ca.authn import TokenIssuer
from control.ca.identity import Identity
from control.debugaccess import DebugAllow
from control.xds.server import XdsOptions
from protos import typeurls
from tests.support.adsclient import AdsStream, node_id
from tests.support.controlplane import bounded_teardown, eventually, state_dir_token

ROOT = Path(__file__).resolve().parents[2]
ISTIOD = Identity("istio-system", "istiod")
SHOP = Identity("shop", "web")
BANK = Identity("bank", "api")
DEBUG_PATHS = (
    "/debug/syncz",
    "/debug/configz",
    "/debug/connections",
    "/debug/pushz",
    "/debug/config_dump?proxyID=web.shop",
    # The dashboard's data follows the same rule (DESIGN "Dashboard").
    "/ui/api/graph",
    "/ui/api/proxies",
    "/ui/api/config",
)


def _options(config: Path, **kw: Any) -> ControlPlaneOptions:
    return ControlPlaneOptions(
        config_paths=(str(config),),
        xds_address="127.0.0.1:0",
        secure_xds_address="127.0.0.1:0",
        http_address=kw.pop("http_address", "127.0.0.1:0"),
        id="test-cp",
        debounce_quiet=0.05,
        debounce_max=1.0,
        config_poll_interval=0.05,
        xds=XdsOptions(control_plane_id="test-cp"),
        **kw,
    )


class Mesh:
    """A control plane whose debug views require a token, with two proxies in different
    namespaces connected over TLS with their own tokens."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.streams: list[AdsStream] = []
        self.channels: list[grpc.aio.Channel] = []

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.cp.http_port}"

    def token(self, identity: Identity, ttl: float = 600) -> str:
        assert self.cp.tokens is not None
        return self.cp.tokens.issue(identity, ttl, time.time())

    def tls_channel(self, identity: Identity) -> grpc.aio.Channel:
        assert self.cp.ca is not None
        creds = grpc.composite_channel_credentials(
            grpc.ssl_channel_credentials(root_certificates=self.cp.ca.root_pem.encode()),
            grpc.access_token_call_credentials(self.token(identity)),
        )
        channel = grpc.aio.secure_channel(f"127.0.0.1:{self.cp.secure_xds_port}", creds)
        self.channels.append(channel)
        return channel

    async def connect_proxy(self, identity: Identity, ip: str, pod: str) -> None:
        s = AdsStream(self.tls_channel(identity))
        req = DiscoveryRequest(type_url=typeurls.CLUSTER)
        req.node.id = node_id(ip, pod, identity.namespace)
        req.node.metadata.update(
            {"NAMESPACE": identity.namespace, "SERVICE_ACCOUNT": identity.service_account}
        )
        await s.send(req)
        await s.recv()
        self.streams.append(s)

    async def close(self) -> None:
        for s in self.streams:
            await s.close()
        for ch in self.channels:
            await ch.close()


@pytest.fixture(scope="module")
async def mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Mesh]:
    config = tmp_path_factory.mktemp("debug-access-config")
    cp = ControlPlane(_options(config, debug_requires_auth=True))
    await cp.start()
    m = Mesh(cp)
    try:
        await m.connect_proxy(SHOP, "127.0.0.21", "web")
        await m.connect_proxy(BANK, "127.0.0.22", "api")
        yield m
    finally:
        await m.close()
        await bounded_teardown(cp.close(0.2), "control plane close")


async def get(
    url: str, token: str | None = None, headers: dict[str, str] | None = None
) -> tuple[int, str, dict[str, str]]:
    hdrs = dict(headers or {})
    if token is not None:
        hdrs["Authorization"] = f"Bearer {token}"
    async with aiohttp.ClientSession() as session, session.get(url, headers=hdrs) as r:
        return r.status, await r.text(), dict(r.headers)


def _assert_401(status: int, body: str, headers: dict[str, str], reason: str) -> None:
    assert status == 401, body
    assert headers.get("WWW-Authenticate", "").startswith("Bearer")
    assert body.count("\n") == 1 and reason in body, body


# --- HTTP /debug/* --------------------------------------------------------------------------


@pytest.mark.parametrize("path", DEBUG_PATHS)
async def test_no_token_is_401(mesh: Mesh, path: str) -> None:
    status, body, headers = await get(mesh.base + path)
    _assert_401(status, body, headers, "Authorization: Bearer <token>")
    assert "sidecar~" not in body and "{" not in body  # nothing of the view leaks


def _alg_none(identity: Identity) -> str:
    def b64(d: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()

    now = int(time.time())
    claims = {
        "iss": "pilotfish",
        "aud": ["istio-ca"],
        "sub": identity.subject,
        "iat": now,
        "nbf": now,
        "exp": now + 600,
    }
    return f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64(claims)}."


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("alg-none", "algorithm 'none' is not accepted"),
        ("wrong-key", "not signed by this control plane"),
        ("expired", "token expired"),
        ("garbage", "not a JWT"),
        ("basic", "not 'Bearer <token>'"),
    ],
)
async def test_bad_token_is_401(mesh: Mesh, case: str, reason: str) -> None:
    headers: dict[str, str] = {}
    if case == "alg-none":
        headers["Authorization"] = f"Bearer {_alg_none(ISTIOD)}"
    elif case == "wrong-key":
        other = TokenIssuer(ec.generate_private_key(ec.SECP256R1()))
        headers["Authorization"] = f"Bearer {other.issue(ISTIOD, 600, time.time())}"
    elif case == "expired":
        assert mesh.cp.tokens is not None
        expired = mesh.cp.tokens.issue(ISTIOD, 60, time.time() - 3600)
        headers["Authorization"] = f"Bearer {expired}"
    elif case == "garbage":
        headers["Authorization"] = "Bearer not-a-token"
    else:
        headers["Authorization"] = "Basic " + base64.b64encode(b"admin:admin").decode()
    status, body, resp_headers = await get(mesh.base + "/debug/syncz", headers=headers)
    _assert_401(status, body, resp_headers, reason)


async def test_allowed_identity_reads_every_view(mesh: Mesh) -> None:
    token = mesh.token(ISTIOD)
    for path in DEBUG_PATHS:
        status, body, _ = await get(mesh.base + path, token)
        assert status == 200, (path, body)
        json.loads(body)
    _, body, _ = await get(mesh.base + "/debug/syncz", token)
    namespaces = sorted(e["namespace"] for e in json.loads(body))
    assert namespaces == ["bank", "shop"]
    _, body, _ = await get(mesh.base + "/debug/config_dump?proxyID=web.shop", token)
    assert json.loads(body)["proxy"] == node_id("127.0.0.21", "web", "shop")
    # Any account of the namespace (default: istio-system/*).
    status, _, _ = await get(mesh.base + "/debug/syncz", mesh.token(Identity("istio-system", "x")))
    assert status == 200


@pytest.mark.parametrize("identity", [SHOP, Identity("default", "default")])
async def test_identity_not_allowed_is_403(mesh: Mesh, identity: Identity) -> None:
    for path in DEBUG_PATHS:
        status, body, headers = await get(mesh.base + path, mesh.token(identity))
        assert status == 403, (path, body)
        assert body == f"{identity} may not read debug views (not in --debug-allow)\n"
        assert "WWW-Authenticate" not in headers


@pytest.mark.parametrize("path", ["/ui/", "/ui/static/app.js", "/ui/api/nothing"])
async def test_dashboard_page_follows_the_debug_rule(mesh: Mesh, path: str) -> None:
    status, body, headers = await get(mesh.base + path)
    _assert_401(status, body, headers, "Authorization: Bearer <token>")
    status, _, _ = await get(mesh.base + path, mesh.token(SHOP))
    assert status == 403
    status, body, headers = await get(mesh.base + path, mesh.token(ISTIOD))
    assert status == (404 if "nothing" in path else 200), body
    assert "script-src 'self'" in headers["Content-Security-Policy"]


async def test_ready_and_metrics_stay_open(mesh: Mesh) -> None:
    status, body, _ = await get(mesh.base + "/ready")
    assert (status, body) == (200, "ready\n")
    status, body, _ = await get(mesh.base + "/metrics")
    assert status == 200 and "pilot_xds" in body
    # A bad token on an open path is not looked at.
    status, _, _ = await get(mesh.base + "/ready", "junk")
    assert status == 200


async def test_unknown_paths_are_closed_too(mesh: Mesh) -> None:
    """Deny by default: only /ready and /metrics are open, so no spelling of a path reaches a
    view without a token (and a view added later starts closed)."""
    for path in ("/debug", "/debug/", "/nothing", "/debug/%73yncz", "//debug/syncz"):
        status, _, _ = await get(mesh.base + path)
        assert status == 401, path


async def test_loopback_bind_is_open(tmp_path: Path) -> None:
    cp = ControlPlane(_options(tmp_path))  # debug_requires_auth None: judged by 127.0.0.1
    await cp.start()
    try:
        base = f"http://127.0.0.1:{cp.http_port}"
        for path in ("/debug/syncz", "/debug/configz", "/debug/connections", "/debug/pushz"):
            status, body, _ = await get(base + path)
            assert status == 200, (path, body)
        status, _, _ = await get(base + "/debug/syncz", "junk")  # not even looked at
        assert status == 200
    finally:
        await bounded_teardown(cp.close(0.2), "control plane close")


async def test_debug_allow_replaces_the_default(tmp_path: Path) -> None:
    allow = DebugAllow.parse("ops/admin,shop/*")
    cp = ControlPlane(_options(tmp_path, debug_requires_auth=True, debug_allow=allow))
    await cp.start()
    try:
        assert cp.tokens is not None
        base = f"http://127.0.0.1:{cp.http_port}/debug/syncz"
        for identity, want in [
            (Identity("ops", "admin"), 200),
            (Identity("shop", "anything"), 200),
            (Identity("ops", "intern"), 403),
            (ISTIOD, 403),  # the default namespace is not added to an explicit list
        ]:
            status, body, _ = await get(base, cp.tokens.issue(identity, 600, time.time()))
            assert status == want, (identity, body)
    finally:
        await bounded_teardown(cp.close(0.2), "control plane close")


# --- syncz over xDS -------------------------------------------------------------------------


async def _syncz_over_xds(channel: grpc.aio.Channel, identity: Identity) -> list[str]:
    """The proxy ids a syncz request on `channel` gets back (our own stream left out)."""
    s = AdsStream(channel)
    try:
        req = DiscoveryRequest(type_url=typeurls.DEBUG_SYNCZ)
        req.node.id = node_id("127.0.0.99", "ctl", identity.namespace)
        req.node.metadata.update(
            {
                "AUTO_REGISTER": "false",
                "NAMESPACE": identity.namespace,
                "SERVICE_ACCOUNT": identity.service_account,
            }
        )
        await s.send(req)
        resp = await s.recv()
    finally:
        await s.close()
    ids = []
    for a in resp.resources:
        cc = ClientConfig()
        a.Unpack(cc)
        ids.append(cc.node.id)
    return sorted(i for i in ids if "~ctl." not in i)


SHOP_ID = node_id("127.0.0.21", "web", "shop")
BANK_ID = node_id("127.0.0.22", "api", "bank")


async def test_syncz_over_tls_allowed_caller_sees_every_stream(mesh: Mesh) -> None:
    ids = await _syncz_over_xds(mesh.tls_channel(ISTIOD), ISTIOD)
    assert ids == sorted([SHOP_ID, BANK_ID])


@pytest.mark.parametrize(("caller", "want"), [(SHOP, [SHOP_ID]), (BANK, [BANK_ID])])
async def test_syncz_over_tls_other_caller_sees_its_namespace(
    mesh: Mesh, caller: Identity, want: list[str]
) -> None:
    # Another account of the namespace: a proxy's own namespace, not its own account.
    other = Identity(caller.namespace, "ctl")
    assert await _syncz_over_xds(mesh.tls_channel(other), other) == want
    outsider = Identity("elsewhere", "ctl")
    assert await _syncz_over_xds(mesh.tls_channel(outsider), outsider) == []


async def test_syncz_over_plaintext_is_unchanged(mesh: Mesh) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{mesh.cp.xds_port}") as ch:
        ids = await _syncz_over_xds(ch, Identity("default", "default"))
    assert ids == sorted([SHOP_ID, BANK_ID])


# --- pilotfish-ctl --------------------------------------------------------------------------


async def _ctl(*argv: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "control.ctl",
        *argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_ctl_proxy_config_sends_its_token_file(mesh: Mesh, tmp_path: Path) -> None:
    address = f"127.0.0.1:{mesh.cp.http_port}"
    args = ("proxy-config", "clusters", "web.shop", "--http-address", address, "-o", "json")
    code, _, err = await _ctl(*args)
    assert code == 1 and "HTTP 401: debug views need 'Authorization: Bearer" in err
    token_file = tmp_path / "token"
    token_file.write_text(mesh.token(SHOP) + "\n")
    code, _, err = await _ctl(*args, "--token-file", str(token_file))
    assert code == 1 and "HTTP 403: shop/web may not read debug views" in err
    token_file.write_text(mesh.token(ISTIOD) + "\n")
    code, out, err = await _ctl(*args, "--token-file", str(token_file))
    assert code == 0, err
    assert isinstance(json.loads(out), list)
    code, _, err = await _ctl(*args, "--token-file", str(tmp_path / "missing"))
    assert code == 1 and "missing: No such file or directory" in err


async def test_ctl_proxy_status_over_tls_sees_what_its_token_allows(
    mesh: Mesh, tmp_path: Path
) -> None:
    assert mesh.cp.ca is not None
    root = tmp_path / "root.pem"
    root.write_text(mesh.cp.ca.root_pem)
    token_file = tmp_path / "token"
    base = (
        "proxy-status",
        "--xds-address",
        f"127.0.0.1:{mesh.cp.secure_xds_port}",
        "--ca-root-cert",
        str(root),
        "--tls-server-name",
        "localhost",
        "-o",
        "json",
    )
    seen = {}
    for identity in (ISTIOD, Identity("shop", "ctl")):
        token_file.write_text(mesh.token(identity))
        code, out, err = await _ctl(*base, "--token-file", str(token_file))
        assert code == 0, err
        seen[identity.namespace] = sorted(r["proxy"] for r in json.loads(out))
    assert seen == {"istio-system": sorted([SHOP_ID, BANK_ID]), "shop": [SHOP_ID]}


# --- a real non-loopback address ------------------------------------------------------------


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


@pytest.fixture
def netns() -> Iterator[tuple[str, str]]:
    """A network namespace with loopback up and 10.250.x.y on a veth inside it: an address
    that is not loopback, and traffic to it never leaves the namespace. Removed on exit,
    with whatever still runs in it."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        pytest.skip("needs root and `ip` (iproute2) for a network namespace")
    name = f"pfdebug{os.getpid()}"
    done = _ip("netns", "add", name, check=False)
    if done.returncode != 0:
        pytest.skip(f"network namespaces are not permitted here: {done.stderr.strip()}")
    address = f"10.250.{os.getpid() % 250}.{1 + os.getpid() // 250 % 250}"
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        # A veth pair with both ends inside (this kernel has no dummy links).
        _ip("-n", name, "link", "add", "dbg0", "type", "veth", "peer", "name", "dbg1")
        _ip("-n", name, "addr", "add", f"{address}/32", "dev", "dbg0")
        _ip("-n", name, "link", "set", "dbg0", "up")
        _ip("-n", name, "link", "set", "dbg1", "up")
        yield name, address
    finally:
        pids = _ip("netns", "pids", name, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), 9)
            except (ProcessLookupError, ValueError):
                pass
        _ip("netns", "del", name, check=False)


_HTTP_PROBE = """
import json, sys, urllib.request, urllib.error
url, token = sys.argv[1], sys.argv[2]
req = urllib.request.Request(url, headers={"Authorization": "Bearer " + token} if token else {})
try:
    with urllib.request.urlopen(req, timeout=5) as r:
        print(json.dumps([r.status, r.read().decode(), dict(r.headers)]))
except urllib.error.HTTPError as e:
    print(json.dumps([e.code, e.read().decode(), dict(e.headers)]))
except OSError as e:
    print(json.dumps([0, str(e), {}]))
"""


def _probe(ns: str, url: str, token: str = "") -> tuple[int, str, dict[str, str]]:
    done = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", _HTTP_PROBE, url, token],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    status, body, headers = json.loads(done.stdout)
    return int(status), str(body), dict(headers)


async def test_real_non_loopback_address_in_a_network_namespace(
    netns: tuple[str, str], tmp_path: Path
) -> None:
    ns, address = netns
    state = tmp_path / "state"
    allowed = state_dir_token(state, "ops", "admin")
    other = state_dir_token(state, "istio-system", "istiod")  # not in the list given below
    (tmp_path / "config").mkdir()
    log = (tmp_path / "control.log").open("wb")
    proc = subprocess.Popen(
        [
            *("ip", "netns", "exec", ns, sys.executable, "-m", "control"),
            *("--config", str(tmp_path / "config"), "--state-dir", str(state)),
            *("--xds-address", "127.0.0.1:15010", "--secure-xds-address", "off"),
            *("--webhook-address", "off", "--http-address", f"{address}:15014"),
            *("--debug-allow", "ops/admin"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    base = f"http://{address}:15014"
    try:

        async def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "control.log").read_text()
            status, _, _ = await asyncio.to_thread(_probe, ns, base + "/ready")
            return status == 200

        await eventually(ready, timeout=30, interval=0.2, what="control plane ready")
        status, body, _ = await asyncio.to_thread(_probe, ns, base + "/metrics")
        assert status == 200 and "pilot_xds" in body
        status, body, headers = await asyncio.to_thread(_probe, ns, base + "/debug/syncz")
        _assert_401(status, body, headers, "Authorization: Bearer <token>")
        status, body, _ = await asyncio.to_thread(_probe, ns, base + "/debug/configz", other)
        assert status == 403, body
        status, body, _ = await asyncio.to_thread(_probe, ns, base + "/debug/configz", allowed)
        assert status == 200 and "objects" in json.loads(body)
        log_text = (tmp_path / "control.log").read_text()
        assert "/debug/* needs a bearer token of ops/admin" in log_text
    finally:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 15)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait, 5)
        log.close()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("istio-system", "'istio-system' is not NS/SA or NS/*"),
        ("ops/admin,Bad/x", "'Bad/x': namespace 'Bad' is not a DNS-1123 label"),
        ("", "names no identity"),
    ],
)
async def test_malformed_debug_allow_is_a_one_line_error(value: str, message: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "control", "--debug-allow", value),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    async with asyncio.timeout(60):
        _, err = await proc.communicate()
    assert proc.returncode == 2
    last = err.decode().strip().splitlines()[-1]
    assert last.startswith(f"pilotfish-control: error: argument --debug-allow: {message}")
    assert "Traceback" not in err.decode()
