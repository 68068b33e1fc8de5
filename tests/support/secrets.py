"""Gateway certificate Secrets for tests: real keys and certificates (TestCA), as the
`v1 Secret` manifests users write (files) and as the API server stores them (Kubernetes)."""

from __future__ import annotations

import base64
import json
from typing import Any

from tests.support.testca import IssuedCert, TestCA

_CA: TestCA | None = None


def secret_object(
    name: str,
    cert: IssuedCert | None,
    *,
    namespace: str = "default",
    ca: bytes | None = None,
    secret_type: str = "kubernetes.io/tls",
    resource_version: str | None = None,
) -> dict[str, Any]:
    """The Secret as the API server holds it (base64 `data`)."""
    data: dict[str, str] = {}
    if cert is not None:
        data["tls.crt"] = base64.b64encode(cert.cert_pem).decode()
        data["tls.key"] = base64.b64encode(cert.key_pem).decode()
    if ca is not None:
        data["ca.crt"] = base64.b64encode(ca).decode()
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if resource_version is not None:
        meta["resourceVersion"] = resource_version
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": secret_type,
        "data": data,
    }


def secret_yaml(name: str, cert: IssuedCert | None, **kwargs: Any) -> str:
    """The same Secret as a YAML document for a config file (JSON is YAML)."""
    return "---\n" + json.dumps(secret_object(name, cert, **kwargs), indent=2) + "\n"


def any_tls_secret(name: str, namespace: str = "default") -> dict[str, Any]:
    """A valid gateway certificate Secret, for tests that only need one to exist."""
    global _CA
    if _CA is None:
        _CA = TestCA()
    return secret_object(name, _CA.server_cert([f"{name}.example.com"]), namespace=namespace)
