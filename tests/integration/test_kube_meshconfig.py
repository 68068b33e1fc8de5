"""Kubernetes mode: the mesh config comes from the ConfigMap `istio` (key `mesh`) in the
control plane's namespace and Telemetry objects from telemetry.istio.io, through the real
list+watch client against the in-test API server (tests/support/kubeapi.py). A ConfigMap
that appears, changes, breaks (`ConfigMap <ns>/istio data.mesh:<line>`, last good kept) and
goes away moves the mesh config the push is built from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from control.app import ControlPlane, ControlPlaneOptions
from control.model.meshconfig import AccessLogEncoding
from control.xds.server import XdsOptions
from tests.support.controlplane import bounded_teardown, eventually
from tests.support.kubeapi import FakeKubeApi


def configmap(namespace: str, mesh: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "istio", "namespace": namespace},
        "data": {"mesh": mesh},
    }


async def test_mesh_config_from_the_istio_configmap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "mesh-system")
    async with FakeKubeApi() as api:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig())
        # A ConfigMap of the same name elsewhere is not the control plane's.
        api.put(configmap("default", "accessLogFile: /wrong\n"))
        mesh_file = tmp_path / "mesh.yaml"
        mesh_file.write_text("accessLogFile: /from-file\n")
        cp = ControlPlane(
            ControlPlaneOptions(
                kubernetes=True,
                kubeconfig=str(kubeconfig),
                mesh_config=str(mesh_file),
                xds_address="127.0.0.1:0",
                http_address="127.0.0.1:0",
                webhook_address="",
                id="kube-cp",
                debounce_quiet=0.02,
                debounce_max=0.5,
                xds=XdsOptions(control_plane_id="kube-cp"),
            )
        )
        await cp.start()
        try:
            # No ConfigMap yet: the file applies.
            assert cp.index.mesh.access_log_file == "/from-file"
            api.put(
                configmap("mesh-system", "accessLogFile: /dev/stdout\naccessLogEncoding: JSON\n")
            )
            await eventually(lambda: cp.index.mesh.access_log_file == "/dev/stdout", timeout=10)
            assert cp.index.mesh.access_log_encoding is AccessLogEncoding.JSON
            # Broken: reported with where it is, the last good one stays.
            api.put(
                configmap("mesh-system", "accessLogFile: /dev/stdout\naccessLogEncoding: XML\n")
            )
            errors = await eventually(lambda: dict(cp.mesh.errors), timeout=10)
            (error,) = errors.values()
            assert str(error).startswith("ConfigMap mesh-system/istio data.mesh:2: ")
            assert cp.index.mesh.access_log_encoding is AccessLogEncoding.JSON
            # A Telemetry object from telemetry.istio.io reaches the model too.
            api.put(
                {
                    "apiVersion": "telemetry.istio.io/v1",
                    "kind": "Telemetry",
                    "metadata": {"name": "mesh-default", "namespace": "istio-system"},
                    "spec": {"accessLogging": [{"disabled": True}]},
                }
            )
            await eventually(lambda: len(cp.index.config.telemetries) == 1, timeout=10)
            # Gone: back to the file.
            api.delete("ConfigMap", "mesh-system", "istio")
            await eventually(lambda: cp.index.mesh.access_log_file == "/from-file", timeout=10)
            assert not cp.mesh.errors
        finally:
            await bounded_teardown(cp.close(0.2), "control plane close")
