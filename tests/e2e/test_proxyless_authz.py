"""AuthorizationPolicy on a proxyless gRPC server, end to end: a real grpcio xDS server and
real grpcio `xds:///` clients, each beside its own `pilotfish-agent --proxy-only`, under
STRICT mTLS. The control plane puts the policies into the server's xDS listener as RBAC HTTP
filters (gRFC A41); gRPC enforces them with the caller's SPIFFE ID from its certificate.

- ALLOW naming the client's service account: calls go through; the same policy naming
  another account: PERMISSION_DENIED, live, without restarting anything; back again: allowed.
- DENY on one method's path: that method is refused, the other still answers.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.support.controlplane import running_control_plane
from tests.support.net import pod_ip
from tests.support.proxyless import (
    CLIENT,
    MESH,
    METHOD,
    PORT,
    SERVER,
    TARGET,
    echo_and_caller,
    peer_authentication,
    python,
    settled,
)

SECRET = "/test.Echo/Secret"


def allow_from(service_account: str) -> str:
    return textwrap.dedent(
        f"""
        apiVersion: security.istio.io/v1
        kind: AuthorizationPolicy
        metadata: {{name: echo-callers, namespace: default}}
        spec:
          selector: {{matchLabels: {{app: echo}}}}
          action: ALLOW
          rules:
          - from:
            - source: {{principals: ["cluster.local/ns/default/sa/{service_account}"]}}
        """
    )


DENY_SECRET = textwrap.dedent(
    f"""
    apiVersion: security.istio.io/v1
    kind: AuthorizationPolicy
    metadata: {{name: no-secret, namespace: default}}
    spec:
      selector: {{matchLabels: {{app: echo}}}}
      action: DENY
      rules:
      - to:
        - operation: {{paths: ["{SECRET}"]}}
    """
)


def denied(call: dict[str, object]) -> bool:
    return call.get("error") == "PERMISSION_DENIED"


def answered(call: dict[str, object]) -> bool:
    return "sans" in call


async def test_allow_and_deny_policies_on_a_proxyless_server(tmp_path: Path) -> None:
    server_ip, client_ip = pod_ip(), pod_ip()
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    (cfg / "peer.yaml").write_text(peer_authentication("STRICT"))
    policy = cfg / "authz.yaml"
    policy.write_text(allow_from("caller"))
    client_boot = tmp_path / "client" / "grpc-bootstrap.json"
    async with running_control_plane(cfg) as cp:
        async with (
            echo_and_caller(cp, tmp_path, server_ip, client_ip),
            python(
                SERVER,
                tmp_path / "server" / "grpc-bootstrap.json",
                f"{server_ip}:{PORT}",
                METHOD,
                SECRET,
            ),
            python(CLIENT, client_boot, TARGET, METHOD, "reuse") as who,
            python(CLIENT, client_boot, TARGET, SECRET, "reuse") as secret,
        ):
            caller = "spiffe://cluster.local/ns/default/sa/caller"
            await settled(who, lambda c: caller in c.get("sans", ()), timeout=30)
            await settled(secret, answered, timeout=15)

            # The policy now names someone else: the caller is refused, on both methods.
            policy.write_text(allow_from("someone-else"))
            await settled(who, denied, timeout=20)
            await settled(secret, denied, timeout=10)

            # Back to the caller, plus a DENY on one method: only that method is refused.
            policy.write_text(allow_from("caller") + "---\n" + DENY_SECRET)
            await settled(who, answered, timeout=20)
            await settled(secret, denied, timeout=10)
            assert all(denied(c) for c in secret.calls()[-5:])

            # Without policies everything is allowed again.
            policy.write_text("")
            await settled(secret, answered, timeout=20)
