"""Talking to the Kubernetes API server: where it is and how to authenticate (in-cluster or a
kubeconfig file), and a small aiohttp client for list, watch, get, create, replace and
merge-patch.

Only what the control plane needs: bearer tokens (in-cluster, kubeconfig `token` or
`tokenFile`), client certificates, the cluster CA (file or inline data) or
`insecure-skip-tls-verify`. The in-cluster token is re-read on every request, since the
kubelet rotates it.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from pilotfish_common.lifecycle import Lifecycle

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeConfigError(Exception):
    """The API server's address or credentials cannot be worked out."""


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True, slots=True)
class KubeConfig:
    server: str  # https://host:port (or http:// for a local proxy)
    token: str = ""
    token_file: str = ""
    ca_file: str = ""
    ca_data: bytes = b""
    client_cert_file: str = ""
    client_key_file: str = ""
    insecure: bool = False
    namespace: str = "default"  # the pod's own namespace in-cluster

    def bearer(self) -> str:
        if self.token_file:
            try:
                return Path(self.token_file).read_text().strip()
            except OSError:
                return self.token
        return self.token

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.server.startswith("https://"):
            return False
        if self.insecure:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.ca_file or self.ca_data:
            ctx = ssl.create_default_context(
                cafile=self.ca_file or None,
                cadata=self.ca_data.decode() if self.ca_data else None,
            )
        else:
            ctx = ssl.create_default_context()
        if self.client_cert_file:
            ctx.load_cert_chain(self.client_cert_file, self.client_key_file or None)
        return ctx


def in_cluster(sa_dir: Path = SA_DIR, environ: Mapping[str, str] | None = None) -> KubeConfig:
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeConfigError(
            "not running in a Kubernetes pod (KUBERNETES_SERVICE_HOST/PORT unset); "
            "give --kubeconfig"
        )
    if not (sa_dir / "token").exists():
        raise KubeConfigError(f"no service account token at {sa_dir / 'token'}")
    if ":" in host:
        host = f"[{host}]"
    try:
        namespace = (sa_dir / "namespace").read_text().strip() or "default"
    except OSError:
        namespace = "default"
    return KubeConfig(
        server=f"https://{host}:{port}",
        token_file=str(sa_dir / "token"),
        ca_file=str(sa_dir / "ca.crt"),
        namespace=namespace,
    )


def from_kubeconfig(path: str, context: str = "") -> KubeConfig:
    """The cluster and user of `context` (default: current-context) in a kubeconfig file."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise KubeConfigError(f"--kubeconfig {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise KubeConfigError(f"--kubeconfig {path}: not YAML: {e}") from None
    if not isinstance(doc, dict):
        raise KubeConfigError(f"--kubeconfig {path}: not a kubeconfig")
    base = Path(path).resolve().parent

    def named(section: str, name: str) -> dict[str, Any]:
        for entry in doc.get(section) or ():
            if isinstance(entry, dict) and entry.get("name") == name:
                return dict(entry.get(section[:-1]) or {})
        raise KubeConfigError(f"--kubeconfig {path}: no {section[:-1]} named {name!r}")

    ctx_name = context or str(doc.get("current-context") or "")
    if not ctx_name:
        raise KubeConfigError(f"--kubeconfig {path}: no current-context")
    ctx = named("contexts", ctx_name)
    cluster = named("clusters", str(ctx.get("cluster", "")))
    user = named("users", str(ctx.get("user", ""))) if ctx.get("user") else {}
    server = str(cluster.get("server") or "")
    if not server.startswith(("https://", "http://")):
        raise KubeConfigError(f"--kubeconfig {path}: cluster server {server!r} is not a URL")

    def rel(p: object) -> str:
        return str(base / str(p)) if p else ""

    cert, key = rel(user.get("client-certificate")), rel(user.get("client-key"))
    if user.get("client-certificate-data"):
        cert = _temp_file(base64.b64decode(str(user["client-certificate-data"])))
    if user.get("client-key-data"):
        key = _temp_file(base64.b64decode(str(user["client-key-data"])))
    ca_data = b""
    if cluster.get("certificate-authority-data"):
        ca_data = base64.b64decode(str(cluster["certificate-authority-data"]))
    return KubeConfig(
        server=server.rstrip("/"),
        token=str(user.get("token") or ""),
        token_file=rel(user.get("tokenFile")),
        ca_file=rel(cluster.get("certificate-authority")),
        ca_data=ca_data,
        client_cert_file=cert,
        client_key_file=key,
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        namespace=str(ctx.get("namespace") or "default"),
    )


def kube_config(kubeconfig: str = "") -> KubeConfig:
    """From the kubeconfig file when given, else in-cluster; raises KubeConfigError."""
    return from_kubeconfig(kubeconfig) if kubeconfig else in_cluster()


def _temp_file(data: bytes) -> str:
    """ssl wants files for client credentials; written 0600 and removed at exit."""
    import atexit

    fd, name = tempfile.mkstemp(prefix="pilotfish-kube-", suffix=".pem")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    atexit.register(lambda: Path(name).unlink(missing_ok=True))
    return name


class KubeClient(Lifecycle):
    """One aiohttp session to the API server; `async with KubeClient(cfg)`."""

    def __init__(self, config: KubeConfig) -> None:
        self.config = config
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self.config.ssl_context(), limit=0)
            self._session = aiohttp.ClientSession(connector=connector)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        token = self.config.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("KubeClient not started")
        return self._session

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        async with self.session.get(
            self.config.server + path,
            params=dict(params or {}),
            headers=self._headers(),
            timeout=aiohttp.ClientTimeout(total=30),
        ) as r:
            return await _json_or_raise(r)

    async def create(self, path: str, body: Mapping[str, Any]) -> Any:
        return await self._send("POST", path, body)

    async def replace(self, path: str, body: Mapping[str, Any]) -> Any:
        """PUT: an update, conditional on body.metadata.resourceVersion (409 when stale)."""
        return await self._send("PUT", path, body)

    async def merge_patch(self, path: str, body: Mapping[str, Any]) -> Any:
        """PATCH with a JSON merge patch (RFC 7386), e.g. of a `.../status` subresource."""
        return await self._send("PATCH", path, body, "application/merge-patch+json")

    async def _send(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any],
        content_type: str = "application/json",
    ) -> Any:
        async with self.session.request(
            method,
            self.config.server + path,
            data=json.dumps(body),
            headers={**self._headers(), "Content-Type": content_type},
            timeout=aiohttp.ClientTimeout(total=10),
        ) as r:
            return await _json_or_raise(r)

    async def list_all(
        self, path: str, page_size: int = 500, label_selector: str = "", field_selector: str = ""
    ) -> tuple[list[Any], str]:
        """Every item (following `continue` pages) and the list's resourceVersion."""
        items: list[Any] = []
        token = ""
        while True:
            params = {"limit": str(page_size)}
            if label_selector:
                params["labelSelector"] = label_selector
            if field_selector:
                params["fieldSelector"] = field_selector
            if token:
                params["continue"] = token
            body = await self.get(path, params)
            items.extend(body.get("items") or ())
            meta = body.get("metadata") or {}
            token = str(meta.get("continue") or "")
            if not token:
                return items, str(meta.get("resourceVersion") or "")

    async def watch(
        self,
        path: str,
        resource_version: str,
        timeout_seconds: int = 300,
        *,
        field_selector: str = "",
    ) -> AsyncIterator[dict[str, Any]]:
        """Watch events, one JSON object per line, until the server ends the stream."""
        params = {
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_seconds),
        }
        if field_selector:
            params["fieldSelector"] = field_selector
        async with self.session.get(
            self.config.server + path,
            params=params,
            headers=self._headers(),
            # Idle watches are normal; the server ends them after timeoutSeconds.
            timeout=aiohttp.ClientTimeout(total=None, sock_read=timeout_seconds + 30),
        ) as r:
            if r.status != 200:
                await _json_or_raise(r)
            async for line in r.content:
                if line.strip():
                    yield json.loads(line)


async def _json_or_raise(r: aiohttp.ClientResponse) -> Any:
    text = await r.text()
    if r.status >= 400:
        try:
            message = json.loads(text).get("message", text)
        except (ValueError, AttributeError):
            message = text.strip()[:200]
        raise ApiError(r.status, str(message))
    return json.loads(text)
