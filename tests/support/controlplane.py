"""Start an in-process control plane on ephemeral ports for tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from control.app import ControlPlane, ControlPlaneOptions
from control.ca.identity import Identity
from control.xds.server import XdsOptions


@asynccontextmanager
async def running_control_plane(
    config_dir: Path,
    *,
    grace: float = 10.0,
    xds_port: int = 0,
    secure_port: int = 0,
    state_dir: Path | None = None,
    secure: bool = True,
    mtls: bool = False,
    ca_files: tuple[Path, Path, Path | None] | None = None,
    max_workload_cert_ttl: float = 24 * 3600.0,
    host: str = "127.0.0.1",
    outbound_traffic_policy: str = "ALLOW_ANY",
    mesh_config: Path | None = None,
    **xds: Any,
) -> AsyncIterator[ControlPlane]:
    """A control plane on ephemeral ports: plaintext xDS, the TLS port (`secure`, on by
    default; `cp.secure_xds_port`, fixed with `secure_port` for restarts) and the
    client-certificate port (`mtls`). Without
    `state_dir` the CA root and token key live in memory (`cp.ca`, `cp.tokens`). `host`: where
    the xDS ports listen (a network-namespace pod reaches the root namespace's gateway).
    `mesh_config`: an Istio MeshConfig file (`--mesh-config`), watched like the config."""
    ca_cert, ca_key, ca_chain = ca_files or ("", "", None)
    opts = ControlPlaneOptions(
        config_paths=(str(config_dir),),
        xds_address=f"{host}:{xds_port}",
        secure_xds_address=f"{host}:{secure_port}" if secure else "",
        mtls_xds_address=f"{host}:0" if mtls else "",
        ca_cert=str(ca_cert),
        ca_key=str(ca_key),
        ca_chain=str(ca_chain or ""),
        max_workload_cert_ttl=max_workload_cert_ttl,
        outbound_traffic_policy=outbound_traffic_policy,
        mesh_config=str(mesh_config) if mesh_config else "",
        state_dir=str(state_dir) if state_dir else "",
        http_address="127.0.0.1:0",
        id="test-cp",
        debounce_quiet=0.05,
        debounce_max=1.0,
        workload_grace=grace,
        config_poll_interval=0.05,
        xds=XdsOptions(control_plane_id="test-cp", **xds),
    )
    cp = ControlPlane(opts)
    await cp.start()
    try:
        yield cp
    finally:
        await bounded_teardown(cp.close(0.2), "control plane close")


@asynccontextmanager
async def running_kube_control_plane(
    kubeconfig: Path, **options: Any
) -> AsyncIterator[ControlPlane]:
    """A control plane in Kubernetes mode (config from the API server `kubeconfig` names,
    e.g. tests/support/kubeapi.py's) on ephemeral ports: plaintext and TLS xDS, debug HTTP.
    `options`: more ControlPlaneOptions fields."""
    cp = ControlPlane(
        ControlPlaneOptions(
            kubernetes=True,
            kubeconfig=str(kubeconfig),
            xds_address="127.0.0.1:0",
            secure_xds_address="127.0.0.1:0",
            http_address="127.0.0.1:0",
            id="kube-cp",
            debounce_quiet=0.05,
            debounce_max=1.0,
            xds=XdsOptions(control_plane_id="kube-cp"),
            **options,
        )
    )
    await cp.start()
    try:
        yield cp
    finally:
        await bounded_teardown(cp.close(0.2), "control plane close")


async def bounded_teardown(aw: Any, what: str, timeout: float = 15.0) -> None:
    """Run a teardown step with a bound. A hang here has been seen rarely (in grpc.aio's
    shutdown after many streams); rather than stall the suite for pytest-timeout, print every
    task's stack (the evidence needed to fix it) and go on: the test itself already passed."""
    try:
        await asyncio.wait_for(aw, timeout)
    except TimeoutError:
        import sys

        print(f"\n[teardown] {what} did not finish in {timeout}s; tasks:", file=sys.stderr)
        for task in asyncio.all_tasks():
            try:
                task.print_stack(limit=8, file=sys.stderr)
            except Exception as e:  # Cython frames (grpc.aio) have no line number
                print(f"{task!r}: no stack ({e!r})", file=sys.stderr)


async def eventually(
    check: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll `check` (sync or async) until it returns a truthy value; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or check}: last={last!r}")


def agent_token(
    cp: ControlPlane,
    namespace: str = "default",
    service_account: str = "default",
    ttl: float = 3600.0,
) -> str:
    """A bearer token the control plane accepts, as `pilotfish-ctl token` would print it."""
    assert cp.tokens is not None, "the control plane has not started"
    return cp.tokens.issue(Identity(namespace, service_account), ttl, time.time())


def state_dir_token(
    state_dir: Path, namespace: str = "default", service_account: str = "default"
) -> str:
    """A token from a state dir's key (created when missing), before the control plane that
    will own that state dir has started: what `pilotfish-ctl token --state-dir` does."""
    from control.ca.authn import TokenIssuer, load_or_create_token_key

    state_dir.mkdir(parents=True, exist_ok=True)
    key = load_or_create_token_key(state_dir)
    return TokenIssuer(key).issue(Identity(namespace, service_account), 3600.0, time.time())
