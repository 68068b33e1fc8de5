"""The injection flags that `pilotfish-control` (the webhook) and `pilotfish-ctl kube-inject`
share, so both inject the same way from the same words. Stdlib only: both CLIs parse flags
before their heavy imports."""

from __future__ import annotations

import argparse
import os


def add_injection_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--hold-application-until-proxy-starts",
        action="store_true",
        help="injected agents start first and hold the app's containers until ready (a "
        "postStart `pilotfish-agent wait`), as MeshConfig "
        "defaultConfig.holdApplicationUntilProxyStarts; a pod's proxy.istio.io/config "
        "annotation overrides it",
    )
    parser.add_argument(
        "--native-sidecars",
        action="store_true",
        default=os.environ.get("ENABLE_NATIVE_SIDECARS", "").lower() == "true",
        help="inject the agent as a Kubernetes native sidecar (an init container with "
        "restartPolicy: Always; Kubernetes >= 1.29); a pod's sidecar.istio.io/nativeSidecar "
        "annotation overrides it (env ENABLE_NATIVE_SIDECARS=true)",
    )
