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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pilotfish-ctl", description="Operator CLI for a Pilotfish mesh."
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("version", help="print the version").set_defaults(func=_version)
    for name, text in (
        ("proxy-status", "sync status of every proxy on every control-plane replica"),
        ("proxy-config", "a proxy's clusters, listeners, routes, endpoints or secrets"),
        ("token", "print a bearer token for a namespace and service account"),
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
