"""Regenerate the committed *_pb2* modules from our .proto files (``make protos``).

Usage: ``python -m protos.generate [--check]``. With ``--check`` nothing is written; the exit
status is 1 (with the list of stale files) when the committed code differs from fresh output.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

PROTOS_DIR = Path(__file__).resolve().parent
SOURCES = ("ca.proto", "nds.proto", "peers.proto", "probe.proto")
# Exactly the files we commit (protoc also writes an empty nds_pb2_grpc.py, which we drop).
OUTPUTS = (
    "ca_pb2.py",
    "ca_pb2.pyi",
    "ca_pb2_grpc.py",
    "nds_pb2.py",
    "nds_pb2.pyi",
    "peers_pb2.py",
    "peers_pb2.pyi",
    "probe_pb2.py",
    "probe_pb2.pyi",
)

_MODULES = "|".join(re.escape(Path(s).stem + "_pb2") for s in SOURCES)
# protoc assumes the output dir is on sys.path; we live in the package `protos`.
_BARE_IMPORT = re.compile(rf"^import ({_MODULES}) as (\w+)$", re.MULTILINE)
_MODULE_NAME = re.compile(rf"(BuildTopDescriptorsAndMessages\(DESCRIPTOR, )'({_MODULES})'")


def _fix_imports(text: str) -> str:
    text = _BARE_IMPORT.sub(rf"from {PROTOS_DIR.name} import \1 as \2", text)
    # Give generated classes their importable module name (repr, pickle).
    return _MODULE_NAME.sub(rf"\1'{PROTOS_DIR.name}.\2'", text)


def generate(out_dir: Path) -> None:
    """Run protoc on SOURCES and write the post-processed OUTPUTS into out_dir."""
    with tempfile.TemporaryDirectory() as raw:
        cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTOS_DIR}"]
        cmd += [f"--{kind}_out={raw}" for kind in ("python", "pyi", "grpc_python")]
        subprocess.run([*cmd, *SOURCES], cwd=PROTOS_DIR, check=True)
        for name in OUTPUTS:
            text = (Path(raw) / name).read_text(encoding="utf-8")
            (out_dir / name).write_text(_fix_imports(text), encoding="utf-8", newline="\n")


def stale_files() -> list[str]:
    """Names in OUTPUTS whose committed content differs from freshly generated code."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = []
        for name in OUTPUTS:
            committed = PROTOS_DIR / name
            fresh = (Path(tmp) / name).read_bytes()
            if not committed.is_file() or committed.read_bytes() != fresh:
                stale.append(name)
        return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m protos.generate", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if generated code is stale")
    args = parser.parse_args(argv)
    if not args.check:
        generate(PROTOS_DIR)
        return 0
    stale = stale_files()
    if stale:
        print(
            f"generated code in {PROTOS_DIR} is stale: {', '.join(stale)}\n"
            "run `make protos` (python -m protos.generate) and commit the result; output also "
            "depends on the grpcio-tools version (see the version stamps in the files)",
            file=sys.stderr,
        )
        return 1
    print(f"generated code is up to date ({len(OUTPUTS)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
