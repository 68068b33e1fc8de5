"""pilotfish-ctl: the operator CLI."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable, Coroutine
from importlib import metadata
from typing import Any, TypeVar

from control.ctl.configdump import KINDS
from control.webhook.flags import add_injection_flags
from pilotfish_common.addresses import is_ip


def _version(args: argparse.Namespace) -> int:
    try:
        v = metadata.version("pilotfish")
    except metadata.PackageNotFoundError:
        v = "unknown (not installed)"
    print(f"pilotfish-ctl {v}")
    return 0


def _addresses(values: list[str], default: str) -> list[str]:
    out = [a.strip() for v in values for a in v.split(",") if a.strip()]
    return out or [default]


def _terminal_width() -> int | None:
    """The terminal's width, or None when stdout is piped (never shorten piped output)."""
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size((120, 24)).columns


T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    import uvloop

    return uvloop.run(coro)


def _proxy_status(args: argparse.Namespace) -> int:
    """Ask every control-plane replica for its syncz (over xDS, type
    istio.io/debug/syncz) and print one row per proxy: the replica it is connected to
    and the state of each xDS type (SYNCED, NOT SENT, STALE, ERROR; - when not
    subscribed). Exits 1 when a replica could not be asked (the others still print)."""
    from control.ctl import status, table

    def fail(message: str, code: int = 1) -> int:
        print(f"pilotfish-ctl proxy-status: {message}", file=sys.stderr)
        return code

    tls: status.TlsOptions | None = None
    if args.ca_root_cert or args.token_file:
        if not args.ca_root_cert:
            return fail("--token-file is sent over TLS only: give --ca-root-cert too", 2)
        from pathlib import Path

        try:
            root = Path(args.ca_root_cert).read_bytes()
            token = Path(args.token_file).read_text().strip() if args.token_file else ""
        except OSError as err:
            return fail(f"{err.filename}: {err.strerror or err}")
        tls = status.TlsOptions(root, token, args.tls_server_name)
        if token:
            try:
                tls.identity()
            except status.TokenError as e:
                return fail(f"--token-file {args.token_file}: {e}", 2)
    if args.kubeconfig or args.kubernetes:
        if args.xds_address:
            return fail("--xds-address and --kubeconfig/--kubernetes are alternatives", 2)
        port = args.xds_port or (15012 if tls else 15010)
        try:
            addresses = _run(_find_replicas(args, port))
        except Exception as e:  # KubeConfigError, ApiError, connection errors: one line
            return fail(f"cannot list control-plane pods: {e or type(e).__name__}")
        if not addresses:
            return fail(
                f"no running control-plane pods in namespace {args.control_plane_namespace} "
                f"with labels {args.control_plane_selector}"
            )
    else:
        addresses = _addresses(args.xds_address, "127.0.0.1:15012" if tls else "127.0.0.1:15010")
    for a in addresses:
        host, sep, port_text = a.rpartition(":")
        if not sep or not host or not port_text.isdigit():
            return fail(f"{a!r} is not HOST:PORT", 2)
    rows, errors = _run(status.gather_status(addresses, args.timeout, tls))
    for replica_error in errors:
        print(f"pilotfish-ctl proxy-status: cannot ask {replica_error}", file=sys.stderr)
    if args.output == "json":
        print(json.dumps([r.as_json() for r in rows], indent=2))
    else:
        headers, body = status.table_rows(rows)
        sys.stdout.write(table.render(headers, body, _terminal_width()))
    return 1 if errors else 0


async def _find_replicas(args: argparse.Namespace, port: int) -> list[str]:
    from control.ctl.discover import find_replicas
    from control.kube.client import kube_config

    return await find_replicas(
        kube_config(args.kubeconfig),
        args.control_plane_namespace,
        args.control_plane_selector,
        port,
    )


def _proxy_config(args: argparse.Namespace) -> int:
    """Show what a proxy holds. TARGET is a pod IP (read from that pod's Envoy admin,
    http://IP:15000/config_dump: what Envoy accepted) or a proxy id / pod.namespace
    (read from the control plane's /debug/config_dump: what it generates)."""
    from control.ctl import configdump, table

    token = ""
    if args.token_file:
        from pathlib import Path

        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as err:
            print(
                f"pilotfish-ctl proxy-config: {err.filename}: {err.strerror or err}",
                file=sys.stderr,
            )
            return 1
    try:
        resources = _run(_dump_resources(args, token))
    except configdump.DumpError as e:
        print(f"pilotfish-ctl proxy-config: {e}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps(resources, indent=2))
    else:
        headers, body = configdump.table(args.kind, resources)
        sys.stdout.write(table.render(headers, body, _terminal_width()))
    return 0


async def _dump_resources(args: argparse.Namespace, token: str) -> list[dict[str, Any]]:
    from urllib.parse import quote

    from control.ctl import configdump

    if is_ip(args.target):
        host = f"[{args.target}]" if ":" in args.target else args.target
        query = "?include_eds" if args.kind == "endpoints" else ""
        url = f"http://{host}:{args.admin_port}/config_dump{query}"
        return configdump.envoy_resources(await configdump.fetch_json(url, args.timeout), args.kind)
    if args.kind not in ("clusters", "listeners", "routes", "endpoints"):
        configdump.control_resources({}, args.kind)  # raises with the reason
    errors = []
    for address in _addresses(args.http_address, "127.0.0.1:15014"):
        url = f"http://{address}/debug/config_dump?proxyID={quote(args.target)}"
        try:
            dump = await configdump.fetch_json(url, args.timeout, token)
        except configdump.DumpError as e:
            errors.append(str(e))
            continue
        return configdump.control_resources(dump, args.kind)
    raise configdump.DumpError("; ".join(errors))


def _token(args: argparse.Namespace) -> int:
    """Print a bearer token (ES256 JWT) signed with the control plane's token key
    (<state-dir>/token-key.pem, created when missing). Agents read it from --token-file;
    the control plane accepts it on both gRPC ports."""
    import time

    from control.ca.authn import TokenIssuer, load_or_create_token_key
    from control.ca.identity import Identity, IdentityError
    from control.duration import parse_duration

    try:
        ttl = parse_duration(args.ttl)
        identity = Identity(args.namespace, args.service_account)
    except (ValueError, IdentityError) as e:
        print(f"pilotfish-ctl token: {e}", file=sys.stderr)
        return 2
    try:
        # Created when missing (race-free with a control plane starting at the same time),
        # so tokens can be minted before the first start.
        key = load_or_create_token_key(args.state_dir)
    except (OSError, ValueError) as e:
        print(f"pilotfish-ctl token: {e}", file=sys.stderr)
        return 1
    print(TokenIssuer(key).issue(identity, ttl, time.time()))
    return 0


def _kube_inject(args: argparse.Namespace) -> int:
    """Manual sidecar injection: the same patch the control plane's webhook makes,
    applied to every Pod and pod template (Deployment, StatefulSet, DaemonSet, Job,
    CronJob, ...) in the input; other objects pass through. Pods that opt out
    (sidecar.istio.io/inject: "false") or already have the sidecar are left alone."""
    from control.ctl.kubeinject import KubeInjectError, inject_documents
    from control.webhook.template import DEFAULT_TEMPLATE, TemplateError, load_template
    from control.webhook.values import InjectionValues

    try:
        template = load_template(args.injection_template or DEFAULT_TEMPLATE)
        if args.filename == "-":
            text, source = sys.stdin.read(), "<stdin>"
        else:
            try:
                with open(args.filename) as f:
                    text, source = f.read(), args.filename
            except OSError as e:
                raise KubeInjectError(f"{args.filename}: {e.strerror or e}") from None
        values = InjectionValues(
            image=args.image,
            pilot_address=args.pilot_address,
            hold_application_until_proxy_starts=args.hold_application_until_proxy_starts,
            native_sidecars=args.native_sidecars,
            revision=args.revision,
        )
        sys.stdout.write(inject_documents(text, template, values, source))
    except (KubeInjectError, TemplateError) as e:
        print(f"pilotfish-ctl kube-inject: {e}", file=sys.stderr)
        return 1
    return 0


def _command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    func: Callable[[argparse.Namespace], int],
    name: str,
    help: str,
) -> argparse.ArgumentParser:
    """Subcommand `name` running `func`; its --help description is `func`'s docstring (argparse
    re-wraps it, so the docstring's line breaks do not show)."""
    parser = sub.add_parser(name, help=help, description=func.__doc__)
    parser.set_defaults(func=func)
    return parser


def _output_and_timeout(parser: argparse.ArgumentParser, timeout_help: str) -> None:
    """The two flags of the commands that ask the mesh and print what it answers."""
    parser.add_argument("--output", "-o", choices=("table", "json"), default="table")
    parser.add_argument("--timeout", type=float, default=5.0, help=timeout_help)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pilotfish-ctl", description="Operator CLI for a Pilotfish mesh."
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("version", help="print the version").set_defaults(func=_version)
    tok = _command(sub, _token, "token", "print a bearer token for a namespace and service account")
    tok.add_argument(
        "--state-dir",
        default="./pilotfish-state",
        help="the control plane's --state-dir (default %(default)s)",
    )
    tok.add_argument("--namespace", "-n", required=True)
    tok.add_argument("--service-account", "-s", required=True)
    tok.add_argument("--ttl", default="1h", help="lifetime, e.g. 90s, 30m, 1h, 2d (default 1h)")
    ps = _command(
        sub,
        _proxy_status,
        "proxy-status",
        "sync status of every proxy on every control-plane replica",
    )
    ps.add_argument(
        "--xds-address",
        action="append",
        default=[],
        metavar="HOST:PORT[,...]",
        help="a replica's xDS address; repeatable or comma-separated "
        "(default 127.0.0.1:15010, or 127.0.0.1:15012 with --ca-root-cert)",
    )
    ps.add_argument(
        "--kubeconfig",
        default="",
        metavar="PATH",
        help="find the replicas through the Kubernetes API: the pods of the control-plane "
        "Deployment (this kubeconfig's current context)",
    )
    ps.add_argument(
        "--kubernetes",
        action="store_true",
        help="as --kubeconfig, with in-cluster credentials (run from a pod)",
    )
    ps.add_argument(
        "--control-plane-namespace",
        default="istio-system",
        help="namespace of the control-plane pods (default %(default)s)",
    )
    ps.add_argument(
        "--control-plane-selector",
        default="app=istiod",
        metavar="LABELS",
        help="label selector of the control-plane pods (default %(default)s)",
    )
    ps.add_argument(
        "--xds-port",
        type=int,
        default=0,
        help="port asked on each pod found (default 15010, or 15012 with --ca-root-cert)",
    )
    ps.add_argument(
        "--ca-root-cert",
        default="",
        metavar="PEM",
        help="the mesh root: turns TLS on (the replicas' TLS xDS port)",
    )
    ps.add_argument(
        "--token-file",
        default="",
        metavar="PATH",
        help="bearer token sent over TLS (`pilotfish-ctl token`, or `kubectl create token "
        "SA --audience istio-ca`); the stream claims the token's namespace and account",
    )
    ps.add_argument(
        "--tls-server-name",
        default="istiod.istio-system.svc",
        help="name expected in the replicas' certificate (default %(default)s)",
    )
    _output_and_timeout(ps, "seconds per replica")
    pc = _command(
        sub,
        _proxy_config,
        "proxy-config",
        "a proxy's clusters, listeners, routes, endpoints or secrets",
    )
    pc.add_argument("kind", choices=KINDS, metavar="{" + ",".join(KINDS) + "}")
    pc.add_argument("target", metavar="TARGET", help="pod IP, proxy id or pod.namespace")
    pc.add_argument(
        "--admin-port", type=int, default=15000, help="Envoy admin port (default %(default)s)"
    )
    pc.add_argument(
        "--http-address",
        action="append",
        default=[],
        metavar="HOST:PORT[,...]",
        help="control-plane --http-address(es) to ask for a proxy id; repeatable or "
        "comma-separated, the first that knows the proxy answers (default 127.0.0.1:15014)",
    )
    pc.add_argument(
        "--token-file",
        default="",
        metavar="PATH",
        help="bearer token sent to the control plane's /debug/config_dump, needed off "
        "loopback: an identity in its --debug-allow (`pilotfish-ctl token -n istio-system "
        "-s ... --ttl 10m`); plain HTTP carries it readable, so keep it short-lived",
    )
    _output_and_timeout(pc, "seconds per request")
    ki = _command(
        sub, _kube_inject, "kube-inject", "print Kubernetes YAML with the agent sidecar injected"
    )
    ki.add_argument(
        "-f", "--filename", required=True, metavar="FILE", help="YAML to inject ('-': stdin)"
    )
    ki.add_argument(
        "--injection-template",
        default="",
        metavar="PATH",
        help="sidecar template: the agent-sidecar ConfigMap or its sidecar.yaml "
        "(default: the one shipped with pilotfish)",
    )
    ki.add_argument("--image", default="", help="agent image (default: the template's)")
    ki.add_argument(
        "--pilot-address",
        default="",
        metavar="HOST:PORT",
        help="control plane address for the agent (default: the template's)",
    )
    add_injection_flags(ki)
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # `pilotfish-ctl ... | head`: the reader left; not an error worth a traceback.
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 0
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()
