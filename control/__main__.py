"""pilotfish-control: the control plane server."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys

# gRPC's fork handlers are for children that go on using gRPC; ours (the CA's signing worker)
# only exec Python. Set before anything imports grpc, as the agent does.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

from control.webhook.flags import add_injection_flags
from control.xds.admission import AdmissionLimits
from pilotfish_common import logsetup, signals

logger = logging.getLogger("control")


def _address(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT")
    return value


def _positive(value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if f < 0:
        raise argparse.ArgumentTypeError(f"{value!r} must not be negative")
    return f


def _duration(value: str) -> float:
    from control.duration import parse_duration

    try:
        return parse_duration(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _debug_allow(value: str) -> object:
    from control.debugaccess import DebugAllow, DebugAllowError

    try:
        return DebugAllow.parse(value)
    except DebugAllowError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _namespace_list(value: str) -> frozenset[str]:
    return frozenset(n.strip() for n in value.split(",") if n.strip())


def _http_url(value: str) -> str:
    from urllib.parse import urlsplit

    if not value:
        return value  # the default: scrape the agents
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{value!r} is not an http:// or https:// URL")
    if parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(f"{value!r}: give the base URL, without ?query or #")
    return value


def _optional_address(value: str) -> str:
    return value if value in ("", "off") else _address(value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pilotfish-control",
        description=(
            "The Pilotfish control plane: reads Istio-style YAML config, computes Envoy "
            "configuration per proxy and serves it over ADS (state-of-the-world and delta)."
        ),
    )
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="PATH",
        help="YAML file or directory (recursive); repeatable; watched and hot-reloaded",
    )
    p.add_argument(
        "--kubernetes",
        action="store_true",
        help="read Services, Pods and Istio config from the Kubernetes API (in-cluster "
        "credentials, or --kubeconfig) instead of --config files",
    )
    p.add_argument(
        "--kubeconfig",
        default="",
        metavar="PATH",
        help="kubeconfig file for --kubernetes (its current context); implies --kubernetes",
    )
    p.add_argument(
        "--xds-address",
        type=_address,
        default="127.0.0.1:15010",
        help="plaintext gRPC address for ADS (default %(default)s)",
    )
    p.add_argument(
        "--secure-xds-address",
        type=_optional_address,
        default="127.0.0.1:15012",
        help=(
            "TLS gRPC address for ADS + CA, serving certificate from our own CA; callers "
            "authenticate with a bearer token ('off' disables; default %(default)s)"
        ),
    )
    p.add_argument(
        "--mtls-xds-address",
        type=_optional_address,
        default="",
        help=(
            "TLS gRPC address for ADS + CA that requires a client certificate issued by our "
            "CA (identity from its SPIFFE ID); default: not served"
        ),
    )
    p.add_argument(
        "--webhook-address",
        type=_optional_address,
        default="127.0.0.1:15017",
        help="HTTPS address of the sidecar injection webhook (POST /inject, AdmissionReview "
        "v1), serving certificate from our own CA ('off' disables; default %(default)s)",
    )
    p.add_argument(
        "--injection-template",
        default="",
        metavar="PATH",
        help="sidecar template: the agent-sidecar ConfigMap (or its sidecar.yaml) "
        "(default: the one shipped with pilotfish, examples/kubernetes/agent-sidecar.yaml)",
    )
    p.add_argument(
        "--injection-image",
        default="",
        metavar="IMAGE",
        help="agent image for injected sidecars (default: the template's)",
    )
    p.add_argument(
        "--injection-pilot-address",
        default="",
        metavar="HOST:PORT",
        help="control plane address injected sidecars use (default: the template's)",
    )
    add_injection_flags(p)
    p.add_argument(
        "--webhook-config-name",
        default=None,
        metavar="NAME",
        help="with --kubernetes: the MutatingWebhookConfiguration whose caBundle is kept equal "
        "to our CA root ('' disables; default pilotfish-sidecar-injector, with --revision "
        "pilotfish-sidecar-injector-REV as Istio names a revision's)",
    )
    p.add_argument(
        "--root-cert-excluded-namespaces",
        type=_namespace_list,
        default=None,
        metavar="NS,NS",
        help="with --kubernetes: namespaces that get no istio-ca-root-cert ConfigMap "
        "(comma-separated, '' for none; default Istio's: kube-system, kube-public, "
        "kube-node-lease, local-path-storage)",
    )
    p.add_argument(
        "--http-address",
        type=_address,
        default="127.0.0.1:15014",
        help="HTTP address for /ready, /metrics, /debug/*, /ui/ (default %(default)s)",
    )
    p.add_argument(
        "--debug-allow",
        type=_debug_allow,
        default=None,
        metavar="NS/SA,...",
        help="identities whose bearer token may read /debug/* on a non-loopback "
        "--http-address (NS/* for a whole namespace; /ready and /metrics stay open, and on "
        "loopback everything does), and every stream in syncz over TLS xDS (others see their "
        "own namespace's); default: the control plane's own namespace, POD_NAMESPACE with "
        "--kubernetes, else istio-system",
    )
    p.add_argument(
        "--ui",
        choices=("on", "off"),
        default="on",
        help="the mesh dashboard at /ui/ on --http-address, under the same access rule as "
        "/debug/* (default %(default)s)",
    )
    p.add_argument(
        "--prometheus-url",
        type=_http_url,
        default="",
        metavar="URL",
        help="a Prometheus whose HTTP API the dashboard reads the Istio standard metrics from "
        "(default: the control plane scrapes its connected agents' status ports itself)",
    )
    p.add_argument(
        "--state-dir",
        default="./pilotfish-state",
        help=(
            "CA root (root-cert.pem, root-key.pem), token key (token-key.pem), "
            "auto-registered workloads; created 0700 with keys 0600 (default %(default)s)"
        ),
    )
    p.add_argument(
        "--ca-cert",
        default="",
        metavar="PEM",
        help="plugged-in CA: signing certificate, a root or an intermediate",
    )
    p.add_argument("--ca-key", default="", metavar="PEM", help="plugged-in CA: its private key")
    p.add_argument(
        "--ca-chain",
        default="",
        metavar="PEM",
        help="plugged-in CA: the certificates above --ca-cert, root last",
    )
    p.add_argument(
        "--max-workload-cert-ttl",
        type=_duration,
        default=24 * 3600.0,
        metavar="DURATION",
        help="longest workload certificate the CA signs, e.g. 24h (default 24h)",
    )
    p.add_argument(
        "--mesh-config",
        default="",
        metavar="FILE",
        help="Istio MeshConfig YAML (the `mesh` key of Istio's ConfigMap: accessLogFile, "
        "extensionProviders, defaultProviders, defaultConfig, ...), watched and hot-reloaded; "
        "with --kubernetes the ConfigMap `istio` in the control plane's namespace comes "
        "first; flags given explicitly win over it",
    )
    p.add_argument(
        "--trust-domain",
        default=None,
        help="SPIFFE trust domain (default: the mesh config's trustDomain, else cluster.local; "
        "read once at startup)",
    )
    p.add_argument(
        "--outbound-traffic-policy",
        type=str.upper,
        choices=("ALLOW_ANY", "REGISTRY_ONLY"),
        default=None,
        help="where proxies in interception mode REDIRECT send traffic to destinations outside "
        "the registry: passed through (ALLOW_ANY) or refused (REGISTRY_ONLY); a Sidecar's "
        "outboundTrafficPolicy overrides it (default: the mesh config's "
        "outboundTrafficPolicy.mode, else ALLOW_ANY)",
    )
    p.add_argument("--id", default=socket.gethostname(), help="this replica's identity")
    p.add_argument(
        "--debounce-after",
        type=_positive,
        default=0.1,
        metavar="SECONDS",
        help="quiet period before a push (default %(default)s)",
    )
    p.add_argument(
        "--debounce-max",
        type=_positive,
        default=10.0,
        metavar="SECONDS",
        help="longest a change waits for a push (default %(default)s)",
    )
    p.add_argument(
        "--workload-grace",
        type=_positive,
        default=10.0,
        metavar="SECONDS",
        help="how long an auto-registered workload outlives its last stream (default %(default)s)",
    )
    p.add_argument(
        "--max-concurrent-pushes",
        type=int,
        default=100,
        help="streams being pushed to at once (default %(default)s)",
    )
    p.add_argument(
        "--connection-rate",
        type=_positive,
        default=200.0,
        help="new xDS streams admitted per second when a storm starts, after a burst of twice "
        "as many; the rate then adapts to how well the control plane keeps up "
        "(default %(default)s)",
    )
    p.add_argument(
        "--connection-rate-max",
        type=_positive,
        default=AdmissionLimits().max_rate,
        help="most new xDS streams admitted per second, however well the control plane keeps "
        "up (default %(default)s)",
    )
    logsetup.add_arguments(p)
    return p


async def _run(args: argparse.Namespace) -> int:
    from control.app import ControlPlane, ControlPlaneOptions
    from control.ca.authority import CaError
    from control.config.errors import ConfigError
    from control.kube.rootcert import DEFAULT_EXCLUDED
    from control.webhook.cabundle import default_name as default_webhook_name
    from control.webhook.template import TemplateError
    from control.xds.server import XdsOptions

    try:
        trust_domain = args.trust_domain or await asyncio.to_thread(
            _mesh_trust_domain, args.mesh_config
        )
    except ConfigError as e:
        print(f"pilotfish-control: {e}", file=sys.stderr)
        return 1
    given = frozenset(
        name
        for name, flag in (
            ("outbound_traffic_policy", args.outbound_traffic_policy),
            ("injection_hold_application", args.hold_application_until_proxy_starts or None),
        )
        if flag is not None
    )
    opts = ControlPlaneOptions(
        mesh_config=args.mesh_config,
        flags_given=given,
        config_paths=tuple(args.config),
        xds_address=args.xds_address,
        secure_xds_address="" if args.secure_xds_address == "off" else args.secure_xds_address,
        mtls_xds_address="" if args.mtls_xds_address == "off" else args.mtls_xds_address,
        http_address=args.http_address,
        state_dir=args.state_dir,
        ca_cert=args.ca_cert,
        ca_key=args.ca_key,
        ca_chain=args.ca_chain,
        max_workload_cert_ttl=args.max_workload_cert_ttl,
        trust_domain=trust_domain,
        outbound_traffic_policy=args.outbound_traffic_policy or "ALLOW_ANY",
        id=args.id,
        debounce_quiet=args.debounce_after,
        debounce_max=args.debounce_max,
        workload_grace=args.workload_grace,
        kubernetes=args.kubernetes or bool(args.kubeconfig),
        kubeconfig=args.kubeconfig,
        webhook_address="" if args.webhook_address == "off" else args.webhook_address,
        injection_template=args.injection_template,
        injection_image=args.injection_image,
        injection_pilot_address=args.injection_pilot_address,
        injection_hold_application=args.hold_application_until_proxy_starts,
        injection_native_sidecars=args.native_sidecars,
        revision=args.revision,
        webhook_config_name=(
            args.webhook_config_name
            if args.webhook_config_name is not None
            else default_webhook_name(args.revision)
        ),
        root_cert_excluded_namespaces=(
            DEFAULT_EXCLUDED
            if args.root_cert_excluded_namespaces is None
            else args.root_cert_excluded_namespaces
        ),
        debug_allow=args.debug_allow,
        ui=args.ui == "on",
        prometheus_url=args.prometheus_url,
        xds=XdsOptions(
            control_plane_id=args.id,
            max_concurrent_pushes=max(1, args.max_concurrent_pushes),
            admission=AdmissionLimits(
                rate=args.connection_rate,
                burst=max(1.0, 2 * args.connection_rate),
                min_rate=min(AdmissionLimits().min_rate, args.connection_rate),
                max_rate=max(args.connection_rate, args.connection_rate_max),
            ),
        ),
    )
    from control.kube.client import KubeConfigError

    try:
        cp = ControlPlane(opts)
    except KubeConfigError as e:
        print(f"pilotfish-control: {e}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    signals.on_stop(stop.set)
    try:
        await cp.start()
    except (ConfigError, CaError, TemplateError) as e:
        print(f"pilotfish-control: {e}", file=sys.stderr)
        await cp.close(0)
        return 1
    except (OSError, RuntimeError) as e:
        print(f"pilotfish-control: {e}", file=sys.stderr)
        await cp.close(0)
        return 1
    await stop.wait()
    logger.info("shutting down")
    await cp.close()
    return 0


def _mesh_trust_domain(path: str) -> str:
    """The trust domain the mesh config file names (read once: identities are issued under
    it for the life of the process)."""
    if not path:
        return "cluster.local"
    from control.config.meshwatch import load_mesh_file

    return load_mesh_file(path).trust_domain


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if bool(args.ca_cert) != bool(args.ca_key):
        parser.error("--ca-cert and --ca-key go together")
    if (args.kubernetes or args.kubeconfig) and args.config:
        parser.error("--config and --kubernetes are alternatives: config comes from one source")
    if args.ca_chain and not args.ca_cert:
        parser.error("--ca-chain needs --ca-cert and --ca-key")
    logsetup.setup(args.log_level, args.log_format)
    # Before the first thread (gRPC's, the executor's, libuv's) allocates: see limit_arenas.
    from control.heap import limit_arenas

    limit_arenas()
    import uvloop

    sys.exit(uvloop.run(_run(args)))


if __name__ == "__main__":
    main()
