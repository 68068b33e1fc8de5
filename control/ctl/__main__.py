"""pilotfish-ctl: the operator CLI."""

from __future__ import annotations

import argparse
import sys
from importlib import metadata


def _version(args: argparse.Namespace) -> int:
    try:
        v = metadata.version("pilotfish")
    except metadata.PackageNotFoundError:
        v = "unknown (not installed)"
    print(f"pilotfish-ctl {v}")
    return 0


def _not_yet(args: argparse.Namespace) -> int:
    print(
        f"pilotfish-ctl: '{args.command}' is not available yet in this version "
        "(see the README's feature table)",
        file=sys.stderr,
    )
    return 2


def _token(args: argparse.Namespace) -> int:
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pilotfish-ctl", description="Operator CLI for a Pilotfish mesh."
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("version", help="print the version").set_defaults(func=_version)
    tok = sub.add_parser(
        "token",
        help="print a bearer token for a namespace and service account",
        description=(
            "Print a bearer token (ES256 JWT) signed with the control plane's token key "
            "(<state-dir>/token-key.pem, created when missing). Agents read it from "
            "--token-file; the control plane accepts it on both gRPC ports."
        ),
    )
    tok.add_argument(
        "--state-dir",
        default="./pilotfish-state",
        help="the control plane's --state-dir (default %(default)s)",
    )
    tok.add_argument("--namespace", "-n", required=True)
    tok.add_argument("--service-account", "-s", required=True)
    tok.add_argument("--ttl", default="1h", help="lifetime, e.g. 90s, 30m, 1h, 2d (default 1h)")
    tok.set_defaults(func=_token)
    for name, text in (
        ("proxy-status", "sync status of every proxy on every control-plane replica"),
        ("proxy-config", "a proxy's clusters, listeners, routes, endpoints or secrets"),
    ):
        sp = sub.add_parser(name, help=text + " (planned)")
        sp.add_argument("rest", nargs=argparse.REMAINDER)
        sp.set_defaults(func=_not_yet)
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    sys.exit(args.func(args))


if __name__ == "__main__":
    main()
