"""The injection flags that `pilotfish-control` (the webhook) and `pilotfish-ctl kube-inject`
share, so both inject the same way from the same words. Stdlib only: both CLIs parse flags
before their heavy imports."""

from __future__ import annotations

import argparse
import os
import re

# A revision is a label value (istio.io/rev=<rev>) and part of object and service names.
_REVISION = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def revision(text: str) -> str:
    """argparse type: "" (no revision) or a lowercase DNS label; "default" means none."""
    if text and not _REVISION.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a revision (lowercase letters, digits and '-', at most 63)"
        )
    return "" if text == "default" else text


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
    parser.add_argument(
        "--revision",
        type=revision,
        default="",
        metavar="REV",
        help="Istio-style revision: inject only pods whose namespace (or, in a namespace "
        "naming no revision, the pod itself) is labelled istio.io/rev=REV; injected agents "
        "connect to istiod-REV.istio-system.svc:15012 unless the pilot address is given; "
        "pilotfish-control also reads only the Istio config labelled istio.io/rev=REV or "
        "not labelled (default: none, the revision 'default')",
    )
